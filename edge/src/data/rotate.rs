//! Image rotation for the rotated-digits domains.

/// Source coordinates closer than this to an integer are snapped to it, so rotations by
/// multiples of 90 degrees move pixels exactly instead of blurring them by rounding errors.
const SNAP: f64 = 1e-6;

/// Rotates one CHW image about its centre, counter-clockwise by `degrees` as displayed (row 0
/// at the top), with bilinear interpolation and zero outside the source image.
///
/// Every output value is a convex combination of input values and the zero background, so it
/// lies within `[min(0, input min), max(0, input max)]`.
///
/// # Panics
///
/// Panics if `image.len() != channels * height * width`.
pub fn rotate_chw(
    image: &[f32],
    channels: usize,
    height: usize,
    width: usize,
    degrees: f32,
) -> Vec<f32> {
    assert_eq!(
        image.len(),
        channels * height * width,
        "rotate_chw: the image has {} values, not channels*height*width = {}",
        image.len(),
        channels * height * width
    );
    let plane = height * width;
    let mut out = vec![0.0f32; image.len()];
    if plane == 0 {
        return out;
    }
    let (sin, cos) = f64::from(degrees).to_radians().sin_cos();
    let cy = (height as f64 - 1.0) / 2.0;
    let cx = (width as f64 - 1.0) / 2.0;
    for r in 0..height {
        for c in 0..width {
            // Output pixel in mathematical coordinates (y up), rotated back by -degrees to
            // find where it came from.
            let x = c as f64 - cx;
            let y = cy - r as f64;
            let xs = x * cos + y * sin;
            let ys = -x * sin + y * cos;
            let col = snap(cx + xs);
            let row = snap(cy - ys);
            let (r0, c0) = (row.floor(), col.floor());
            let (fr, fc) = (row - r0, col - c0);
            let taps = [
                (r0, c0, (1.0 - fr) * (1.0 - fc)),
                (r0, c0 + 1.0, (1.0 - fr) * fc),
                (r0 + 1.0, c0, fr * (1.0 - fc)),
                (r0 + 1.0, c0 + 1.0, fr * fc),
            ];
            for ch in 0..channels {
                let src = &image[ch * plane..(ch + 1) * plane];
                let mut value = 0.0f64;
                for &(tr, tc, weight) in &taps {
                    if weight == 0.0 {
                        continue;
                    }
                    if tr >= 0.0 && tc >= 0.0 && tr < height as f64 && tc < width as f64 {
                        value += weight * f64::from(src[tr as usize * width + tc as usize]);
                    }
                }
                out[ch * plane + r * width + c] = value as f32;
            }
        }
    }
    out
}

/// Snaps `v` to the nearest integer when it is within [`SNAP`] of it.
fn snap(v: f64) -> f64 {
    let rounded = v.round();
    if (v - rounded).abs() < SNAP {
        rounded
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-channel 3x4 test image with distinct positive values.
    fn sample() -> Vec<f32> {
        (0..24).map(|v| v as f32 + 1.0).collect()
    }

    #[test]
    fn rotating_by_zero_degrees_is_the_identity() {
        let image = sample();
        assert_eq!(rotate_chw(&image, 2, 3, 4, 0.0), image);
    }

    #[test]
    fn rotating_by_360_degrees_is_the_identity() {
        let image = sample();
        let rotated = rotate_chw(&image, 2, 3, 4, 360.0);
        for (a, b) in rotated.iter().zip(&image) {
            assert!((a - b).abs() < 1e-4, "{a} != {b}");
        }
    }

    #[test]
    fn rotating_a_square_image_by_90_degrees_turns_it_counter_clockwise() {
        // Only the top-right pixel is set; a quarter turn counter-clockwise moves it to the
        // top-left, and the bottom-left pixel moves to the bottom-right.
        let mut image = vec![0.0f32; 9];
        image[2] = 5.0;
        image[6] = 7.0;
        let rotated = rotate_chw(&image, 1, 3, 3, 90.0);
        let mut expected = vec![0.0f32; 9];
        expected[0] = 5.0;
        expected[8] = 7.0;
        assert_eq!(rotated, expected);
        // Four quarter turns bring the image back.
        let mut back = image.clone();
        for _ in 0..4 {
            back = rotate_chw(&back, 1, 3, 3, 90.0);
        }
        assert_eq!(back, image);
    }

    #[test]
    fn rotated_values_stay_within_the_input_range_and_background() {
        let image: Vec<f32> = (0..64).map(|v| ((v * 37) % 17) as f32).collect();
        let (lo, hi) = image
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let (lo, hi) = (lo.min(0.0), hi.max(0.0));
        for degrees in [7.0, 15.0, 33.3, 45.0, 75.0, 123.0, -20.0] {
            for &v in &rotate_chw(&image, 1, 8, 8, degrees) {
                assert!(v >= lo - 1e-5 && v <= hi + 1e-5, "{v} outside [{lo}, {hi}]");
            }
        }
    }

    #[test]
    fn rotating_a_uniform_image_keeps_the_centre_and_zeroes_the_corners() {
        let image = vec![1.0f32; 64];
        let rotated = rotate_chw(&image, 1, 8, 8, 45.0);
        assert!((rotated[3 * 8 + 3] - 1.0).abs() < 1e-6);
        assert_eq!(rotated[0], 0.0);
        assert_eq!(rotated[63], 0.0);
    }
}
