//! Decoding image files and bodies into the raw CHW values the backbones are fed: one place
//! for training data (ImageFolder) and for predictions (files, HTTP bodies), so a model sees
//! the same pixels in use as in training.

use std::path::Path;

use image::imageops::{self, FilterType};
use image::{DynamicImage, ImageBuffer, ImageReader, Pixel};

use super::DataError;

/// Decodes an image held in memory, guessing the format (PNG or JPEG) from its content.
pub fn decode_bytes(bytes: &[u8]) -> Result<DynamicImage, image::ImageError> {
    decode_bytes_within(bytes, image::Limits::default())
}

/// [`decode_bytes`] within `limits` (sides, allocation): what a request from the network is
/// decoded with.
pub fn decode_bytes_within(
    bytes: &[u8],
    limits: image::Limits,
) -> Result<DynamicImage, image::ImageError> {
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(image::ImageError::IoError)?;
    reader.limits(limits);
    reader.decode()
}

/// Reads and decodes one image file, guessing the format from its content.
pub fn decode(path: &Path) -> Result<DynamicImage, DataError> {
    let reader = ImageReader::open(path)
        .and_then(ImageReader::with_guessed_format)
        .map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    reader.decode().map_err(|source| DataError::Decode {
        path: path.to_path_buf(),
        source,
    })
}

/// Converts an image to `channels` 8-bit channels, resizes it to `h` x `w` and returns its
/// values in CHW order.
pub fn to_chw(image: DynamicImage, channels: usize, h: u32, w: u32) -> Vec<f32> {
    if channels == 1 {
        planar(&resized(image.into_luma8(), h, w))
    } else {
        planar(&resized(image.into_rgb8(), h, w))
    }
}

/// Resizes with a triangle filter, or returns the image unchanged when it already has the size.
fn resized<P>(image: ImageBuffer<P, Vec<u8>>, h: u32, w: u32) -> ImageBuffer<P, Vec<u8>>
where
    P: Pixel<Subpixel = u8> + 'static,
{
    if image.dimensions() == (w, h) {
        image
    } else {
        imageops::resize(&image, w, h, FilterType::Triangle)
    }
}

/// Reorders an interleaved (HWC) 8-bit image into CHW values.
fn planar<P>(image: &ImageBuffer<P, Vec<u8>>) -> Vec<f32>
where
    P: Pixel<Subpixel = u8>,
{
    let channels = usize::from(P::CHANNEL_COUNT);
    let raw = image.as_raw();
    (0..channels)
        .flat_map(|c| raw.iter().skip(c).step_by(channels).map(|&v| f32::from(v)))
        .collect()
}
