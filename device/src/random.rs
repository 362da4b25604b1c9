//! Random draws the device's code shares (a leaf module).

use rand::Rng;

/// A standard normal draw (Box–Muller; `1 − u` keeps the logarithm finite).
pub fn standard_normal(rng: &mut impl Rng) -> f32 {
    let (u1, u2): (f32, f32) = (rng.random(), rng.random());
    (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}
