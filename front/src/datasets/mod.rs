//! The benchmark's synthetic shifts, built from the built-in digits and Fashion-MNIST: the lab's
//! data, not a device's (a device reads the built-in digits or its own image folder, in
//! `fedge_edge::data`).
//!
//! [`background_domains`] pastes objects on textures with a per-site shortcut (`digits-bg`,
//! `fashion-mnist-bg`), [`sensor_domains`] shows each site through its own sensor
//! (`digits-sensor`: contrast, light, noise, blur), and [`fashion_mnist_domains`] rotates
//! Fashion-MNIST read from IDX files (Debian's `dataset-fashion-mnist`).

mod background;
mod fashion;
mod sensor;

pub use background::{BiasedDomain, DEFAULT_BIAS, TEXTURES, background_domains, texture};
pub use fashion::{FASHION_MNIST_DIR, fashion_mnist, fashion_mnist_domains, read_idx};
pub use sensor::{SENSORS, Sensor, sensor_domains};

use fedge_edge::data::{DataError, Domain, load_digits};

/// `domains` background-bias domains of the digits (`digits-bg`, see
/// [`background_domains`]): disjoint parts, unrotated, each with its own background shortcut
/// of strength `bias`.
pub fn digits_bg_domains(
    domains: usize,
    bias: f32,
    seed: u64,
) -> Result<Vec<BiasedDomain>, DataError> {
    background_domains(&load_digits(), domains, bias, seed)
}

/// The digits through the six sensors of [`SENSORS`] (`digits-sensor`): disjoint parts,
/// unrotated, each seen by its own sensor.
pub fn digits_sensor_domains(seed: u64) -> Vec<Domain> {
    sensor_domains(&load_digits(), &SENSORS, seed)
}
