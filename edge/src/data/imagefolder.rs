//! ImageFolder trees: `root/<domain>/<class>/*.{png,jpg,jpeg}`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use image::imageops::{self, FilterType};
use image::{DynamicImage, ImageBuffer, ImageReader, Pixel};

use super::{DataError, Domain, ImageSet};

/// The accepted image file extensions, compared case-insensitively.
const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// Loads one domain per folder of an ImageFolder tree `root/<domain>/<class>/*.png`.
///
/// The domains are the top-level folders of `root`, sorted by name. The class names are the
/// union of the class folder names over all domains, sorted, so a label means the same class in
/// every domain even when a domain lacks some classes. Files with a `.png`, `.jpg` or `.jpeg`
/// extension (in any case) are read in sorted order; other files and folders whose names start
/// with a dot are ignored. Every image is decoded with the `image` crate (the format is guessed
/// from the content), converted to `channels` (1 for grayscale, 3 for RGB), resized to
/// `height` x `width` with a triangle filter unless it already has that size, and stored CHW
/// with raw values 0..=255.
///
/// # Errors
///
/// Returns a [`DataError`] when `channels` is neither 1 nor 3, when the size is zero, when the
/// root is missing or has no domain folders, when a domain has no images, when a folder cannot
/// be listed, or when a file cannot be read or decoded.
pub fn imagefolder_domains(
    root: &Path,
    channels: usize,
    height: usize,
    width: usize,
) -> Result<Vec<Domain>, DataError> {
    if channels != 1 && channels != 3 {
        return Err(DataError::UnsupportedChannels { channels });
    }
    let (h, w) = match (u32::try_from(height), u32::try_from(width)) {
        (Ok(h), Ok(w)) if h > 0 && w > 0 => (h, w),
        _ => return Err(DataError::InvalidSize { height, width }),
    };
    if !root.exists() {
        return Err(DataError::MissingRoot {
            root: root.to_path_buf(),
        });
    }
    if !root.is_dir() {
        return Err(DataError::RootNotAFolder {
            root: root.to_path_buf(),
        });
    }
    let domain_dirs = sorted_entries(root, true)?;
    if domain_dirs.is_empty() {
        return Err(DataError::NoDomains {
            root: root.to_path_buf(),
        });
    }

    // First pass: list every domain's class folders and image files, so the class names are
    // known before any label is assigned.
    let mut listings = Vec::with_capacity(domain_dirs.len());
    let mut class_set = BTreeSet::new();
    for (domain_name, domain_dir) in domain_dirs {
        let mut classes = Vec::new();
        for (class_name, class_dir) in sorted_entries(&domain_dir, true)? {
            let files: Vec<PathBuf> = sorted_entries(&class_dir, false)?
                .into_iter()
                .map(|(_, path)| path)
                .filter(|path| has_image_extension(path))
                .collect();
            class_set.insert(class_name.clone());
            classes.push((class_name, files));
        }
        if classes.iter().all(|(_, files)| files.is_empty()) {
            return Err(DataError::EmptyDomain { path: domain_dir });
        }
        listings.push((domain_name, classes));
    }
    let class_names: Vec<String> = class_set.into_iter().collect();

    // Second pass: decode the images.
    let image_len = channels * height * width;
    let mut domains = Vec::with_capacity(listings.len());
    for (domain_name, classes) in listings {
        let total: usize = classes.iter().map(|(_, files)| files.len()).sum();
        let mut images = Vec::with_capacity(total * image_len);
        let mut labels = Vec::with_capacity(total);
        for (class_name, files) in classes {
            let label = class_names
                .binary_search(&class_name)
                .expect("every class folder name is in the class union");
            let label = u32::try_from(label).expect("fewer than 2^32 classes");
            for path in files {
                let decoded = decode(&path)?;
                images.extend(to_chw(decoded, channels, h, w));
                labels.push(label);
            }
        }
        domains.push(Domain {
            name: domain_name,
            data: ImageSet {
                channels,
                height,
                width,
                class_names: class_names.clone(),
                images,
                labels,
                raw_max: 255.0,
            },
        });
    }
    Ok(domains)
}

/// Lists the entries of `dir` that are folders (`folders == true`) or files, sorted by name,
/// skipping names that start with a dot.
fn sorted_entries(dir: &Path, folders: bool) -> Result<Vec<(String, PathBuf)>, DataError> {
    let io_error = |source| DataError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `Path::is_dir` follows symbolic links, so linked folders and files count too.
        if path.is_dir() == folders {
            entries.push((name, path));
        }
    }
    entries.sort();
    Ok(entries)
}

/// Returns true when `path` ends in one of [`EXTENSIONS`], in any case.
fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|ext| ext.to_str())
        .is_some_and(|ext| EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

/// Reads and decodes one image file, guessing the format from its content.
fn decode(path: &Path) -> Result<DynamicImage, DataError> {
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
fn to_chw(image: DynamicImage, channels: usize, h: u32, w: u32) -> Vec<f32> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use image::{Luma, Rgb, RgbImage};

    /// Writes a 2x2 RGB PNG whose pixel (x, y) is `[base + x, base + 10 * y, 200]`.
    fn write_png(path: &Path, base: u8) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let image = RgbImage::from_fn(2, 2, |x, y| Rgb([base + x as u8, base + 10 * y as u8, 200]));
        image.save(path).unwrap();
    }

    /// Builds `a/{cat,dog}` and `b/dog` (b lacks `cat`), plus files that must be ignored.
    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write_png(&root.join("a/dog/1.png"), 100);
        write_png(&root.join("a/cat/2.PNG"), 50);
        write_png(&root.join("a/cat/1.png"), 40);
        write_png(&root.join("b/dog/x.png"), 0);
        std::fs::write(root.join("a/cat/notes.txt"), "not an image").unwrap();
        std::fs::write(root.join("readme.md"), "not a domain").unwrap();
        std::fs::create_dir_all(root.join(".hidden/cat")).unwrap();
        dir
    }

    #[test]
    fn imagefolder_labels_agree_across_domains_and_values_are_chw() {
        let dir = tree();
        let domains = imagefolder_domains(dir.path(), 3, 2, 2).unwrap();
        let names: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        for domain in &domains {
            assert_eq!(domain.data.class_names, ["cat", "dog"]);
            assert_eq!(domain.data.image_len(), 12);
        }
        let a = &domains[0].data;
        assert_eq!(a.labels, [0, 0, 1]);
        // Sorted files: cat/1.png (base 40) comes before cat/2.PNG (base 50).
        #[rustfmt::skip]
        let expected: [f32; 12] = [
            40.0, 41.0, 40.0, 41.0, // red: base + x
            40.0, 40.0, 50.0, 50.0, // green: base + 10 y
            200.0, 200.0, 200.0, 200.0, // blue
        ];
        assert_eq!(a.image(0), expected);
        assert_eq!(a.image(1)[0], 50.0);
        assert_eq!(a.image(2)[0], 100.0);
        let b = &domains[1].data;
        assert_eq!(b.labels, [1]);
        assert_eq!(b.image(0)[..4], [0.0, 1.0, 0.0, 1.0]);
    }

    #[test]
    fn imagefolder_converts_to_grayscale_and_resizes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d/c/img.png");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::GrayImage::from_pixel(4, 6, Luma([77]))
            .save(&path)
            .unwrap();
        let domains = imagefolder_domains(dir.path(), 1, 3, 2).unwrap();
        let data = &domains[0].data;
        assert_eq!((data.channels, data.height, data.width), (1, 3, 2));
        assert_eq!(data.images, vec![77.0; 6]);
    }

    #[test]
    fn imagefolder_reports_a_missing_root() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = imagefolder_domains(&missing, 3, 8, 8).unwrap_err();
        assert!(matches!(err, DataError::MissingRoot { .. }));
        let message = err.to_string();
        assert!(message.contains("does not exist"), "{message}");
        assert!(message.contains("root/<domain>/<class>/*.png"), "{message}");
    }

    #[test]
    fn imagefolder_names_a_corrupt_file() {
        let dir = tree();
        let corrupt = dir.path().join("b/dog/y.png");
        std::fs::write(&corrupt, b"this is not a png").unwrap();
        let err = imagefolder_domains(dir.path(), 3, 2, 2).unwrap_err();
        assert!(matches!(err, DataError::Decode { .. }), "{err:?}");
        assert!(err.to_string().contains("y.png"), "{err}");
    }

    #[test]
    fn imagefolder_reports_empty_roots_empty_domains_and_bad_settings() {
        let dir = tempfile::tempdir().unwrap();
        let err = imagefolder_domains(dir.path(), 3, 2, 2).unwrap_err();
        assert!(matches!(err, DataError::NoDomains { .. }), "{err:?}");
        std::fs::create_dir_all(dir.path().join("d/c")).unwrap();
        let err = imagefolder_domains(dir.path(), 3, 2, 2).unwrap_err();
        assert!(matches!(err, DataError::EmptyDomain { .. }), "{err:?}");
        assert!(err.to_string().contains("has no images"), "{err}");
        let err = imagefolder_domains(dir.path(), 2, 2, 2).unwrap_err();
        assert!(matches!(
            err,
            DataError::UnsupportedChannels { channels: 2 }
        ));
        let err = imagefolder_domains(dir.path(), 3, 0, 2).unwrap_err();
        assert!(matches!(err, DataError::InvalidSize { .. }));
    }
}
