//! ImageFolder trees: `root/<domain>/<class>/*.{png,jpg,jpeg}`, with optional object boxes in
//! `root/<domain>/boxes.csv`; a device reads only its own site folder, `site/<class>/*`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::decode::{decode, to_chw};
use super::progress::{LoadReport, Phase, Progress};
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
/// A domain folder may hold `boxes.csv`, lines `file,x1,y1,x2,y2`: `file` relative to the
/// domain folder (`dog/001.png`), the box in pixels of the original image (x to the right, y
/// down, corners inclusive-exclusive; a header line starting with `file` and lines starting
/// with `#` are skipped). Then the domain's [`ImageSet::masks`] mark the pixels of the resized
/// image whose centres fall in any of the file's boxes; an image without a line is all object
/// (no background to swap). Without `boxes.csv` the domain has no masks.
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
        let classes = list_site(&domain_dir)?;
        class_set.extend(classes.iter().map(|(name, _)| name.clone()));
        listings.push((domain_name, domain_dir, classes));
    }
    let class_names: Vec<String> = class_set.into_iter().collect();

    // Second pass: decode the images.
    let mut domains = Vec::with_capacity(listings.len());
    for (name, dir, classes) in listings {
        let data = load_site(&dir, classes, &class_names, channels, (h, w), None)?;
        domains.push(Domain { name, data });
    }
    Ok(domains)
}

/// A device's site folder as loaded: the images, and the files left out because they did not
/// decode (a half-written upload, a corrupt file), each with the reason.
#[derive(Debug, Clone)]
pub struct SiteImages {
    /// The images that decoded.
    pub images: ImageSet,
    /// The files that did not, with why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Loads one site folder `dir/<class>/*.png` alone, as a device holds it: its classes are its
/// own class folders, sorted (a device renumbers them onto the federation's list by name).
/// Decoding, resizing and `boxes.csv` are as in [`imagefolder_domains`], except that a file
/// that does not decode is left out and listed in [`SiteImages::skipped`]: one bad file in a
/// live folder must not keep a device from starting. How far the reading got is shown as it
/// goes, and the files left out are counted, in the process's [`LoadReport`].
///
/// # Errors
///
/// As [`imagefolder_domains`]; a folder without images is [`DataError::EmptyDomain`].
pub fn imagefolder_site(
    dir: &Path,
    channels: usize,
    height: usize,
    width: usize,
) -> Result<SiteImages, DataError> {
    imagefolder_site_reporting(dir, (channels, height, width), &LoadReport::process())
}

/// [`imagefolder_site`] at `(channels, height, width)`, showing its progress and counting the
/// files left out in `report`.
pub fn imagefolder_site_reporting(
    dir: &Path,
    (channels, height, width): (usize, usize, usize),
    report: &LoadReport,
) -> Result<SiteImages, DataError> {
    if channels != 1 && channels != 3 {
        return Err(DataError::UnsupportedChannels { channels });
    }
    let (h, w) = match (u32::try_from(height), u32::try_from(width)) {
        (Ok(h), Ok(w)) if h > 0 && w > 0 => (h, w),
        _ => return Err(DataError::InvalidSize { height, width }),
    };
    if !dir.exists() {
        return Err(DataError::MissingRoot {
            root: dir.to_path_buf(),
        });
    }
    if !dir.is_dir() {
        return Err(DataError::RootNotAFolder {
            root: dir.to_path_buf(),
        });
    }
    let classes = list_site(dir)?;
    let class_names: Vec<String> = classes.iter().map(|(name, _)| name.clone()).collect();
    let mut skipped = Vec::new();
    let site = Site {
        skipped: &mut skipped,
        report,
    };
    let images = load_site(dir, classes, &class_names, channels, (h, w), Some(site))?;
    if images.is_empty() {
        return Err(DataError::EmptyDomain {
            path: dir.to_path_buf(),
        });
    }
    Ok(SiteImages { images, skipped })
}

/// Where a site's loading reports: the files left out, and the progress and counts of
/// [`LoadReport`].
struct Site<'a> {
    skipped: &'a mut Vec<(PathBuf, String)>,
    report: &'a LoadReport,
}

/// A site's class folders (sorted) with their image files (sorted); an error when there is no
/// image at all.
pub fn list_site(dir: &Path) -> Result<Vec<(String, Vec<PathBuf>)>, DataError> {
    let mut classes = Vec::new();
    for (class_name, class_dir) in sorted_entries(dir, true)? {
        let files: Vec<PathBuf> = sorted_entries(&class_dir, false)?
            .into_iter()
            .map(|(_, path)| path)
            .filter(|path| has_image_extension(path))
            .collect();
        classes.push((class_name, files));
    }
    if classes.iter().all(|(_, files)| files.is_empty()) {
        return Err(DataError::EmptyDomain {
            path: dir.to_path_buf(),
        });
    }
    Ok(classes)
}

/// Decodes a listed site, labelling each class folder by its place in `class_names`. A file
/// that does not decode is an error, or, given a `site`, left out, listed and counted there,
/// which also shows the reading's progress.
fn load_site(
    dir: &Path,
    classes: Vec<(String, Vec<PathBuf>)>,
    class_names: &[String],
    channels: usize,
    (h, w): (u32, u32),
    mut site: Option<Site<'_>>,
) -> Result<ImageSet, DataError> {
    let (height, width) = (h as usize, w as usize);
    let image_len = channels * height * width;
    let total: usize = classes.iter().map(|(_, files)| files.len()).sum();
    let mut progress = (site.as_ref()).map(|s| {
        Progress::start(
            s.report,
            Phase::Reading,
            total as u64,
            "reading the site folder",
        )
    });
    let mut images = Vec::with_capacity(total * image_len);
    let mut labels = Vec::with_capacity(total);
    let boxes = read_boxes(&dir.join("boxes.csv"))?;
    let mut masks = boxes
        .as_ref()
        .map(|_| Vec::with_capacity(total * height * width));
    for (class_name, files) in classes {
        let label = class_names
            .binary_search(&class_name)
            .expect("every class folder name is in the class list");
        let label = u32::try_from(label).expect("fewer than 2^32 classes");
        for path in files {
            if let Some(progress) = progress.as_mut() {
                progress.advance(1);
            }
            let decoded = match (decode(&path), site.as_mut()) {
                (Ok(decoded), _) => decoded,
                (Err(e), Some(site)) => {
                    site.report.skip(dir, &path, &e.file_reason());
                    site.skipped.push((path, e.to_string()));
                    continue;
                }
                (Err(e), None) => return Err(e),
            };
            if let (Some(boxes), Some(masks)) = (&boxes, masks.as_mut()) {
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                let key = format!("{class_name}/{}", file.unwrap_or_default());
                let original = (decoded.width(), decoded.height());
                let mine = boxes.get(&key).map_or(&[][..], Vec::as_slice);
                masks.extend(box_mask(mine, original, (w, h)));
            }
            images.extend(to_chw(decoded, channels, h, w));
            labels.push(label);
        }
    }
    if let (Some(progress), Some(site)) = (progress, &site) {
        let skipped = site.skipped.len();
        progress.end(&format!(
            "site folder read: {total} files, {} images, {skipped} skipped",
            labels.len()
        ));
    }
    Ok(ImageSet {
        channels,
        height,
        width,
        class_names: class_names.to_vec(),
        images,
        labels,
        raw_max: 255.0,
        masks,
    })
}

/// Boxes `[x1, y1, x2, y2]` by file (`class/name.png`).
type Boxes = BTreeMap<String, Vec<[f32; 4]>>;

/// The boxes of a `boxes.csv` by file (`class/name.png`), or `None` when there is no such file.
fn read_boxes(path: &Path) -> Result<Option<Boxes>, DataError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DataError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut boxes = Boxes::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || (i == 0 && line.starts_with("file")) {
            continue;
        }
        let bad = |reason: String| DataError::BadBoxes {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [file, coords @ ..] = fields.as_slice() else {
            return Err(bad("empty line".into()));
        };
        if coords.len() != 4 {
            return Err(bad(format!("{} fields, expected 5", fields.len())));
        }
        let mut b = [0f32; 4];
        for (v, text) in b.iter_mut().zip(coords) {
            *v = text
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| bad(format!("{text:?} is not a pixel coordinate")))?;
        }
        if b[2] <= b[0] || b[3] <= b[1] {
            return Err(bad("x2 must exceed x1 and y2 exceed y1".into()));
        }
        boxes.entry(file.replace('\\', "/")).or_default().push(b);
    }
    Ok(Some(boxes))
}

/// The `h × w` mask (row-major) of `boxes` given on an image of `(width, height)` pixels, after
/// resizing to `(w, h)`: 1 where a pixel's centre falls in a box; all 1 without boxes.
fn box_mask(boxes: &[[f32; 4]], (ow, oh): (u32, u32), (w, h): (u32, u32)) -> Vec<u8> {
    if boxes.is_empty() {
        return vec![1; (w * h) as usize];
    }
    let (sx, sy) = (ow as f32 / w as f32, oh as f32 / h as f32);
    let mut out = Vec::with_capacity((w * h) as usize);
    for r in 0..h {
        let y = (r as f32 + 0.5) * sy;
        for c in 0..w {
            let x = (c as f32 + 0.5) * sx;
            let inside = boxes
                .iter()
                .any(|[x1, y1, x2, y2]| x >= *x1 && x < *x2 && y >= *y1 && y < *y2);
            out.push(u8::from(inside));
        }
    }
    out
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
    fn boxes_csv_gives_masks_scaled_to_the_resized_image() {
        let dir = tree();
        let root = dir.path();
        // a/cat/1.png is 2x2, resized to 4x4: the box covers its left column.
        std::fs::write(
            root.join("a/boxes.csv"),
            "file,x1,y1,x2,y2\ncat/1.png,0,0,1,2\n# a comment\n",
        )
        .unwrap();
        let domains = imagefolder_domains(root, 3, 4, 4).unwrap();
        let a = &domains[0].data;
        assert!(domains[1].data.masks.is_none(), "b has no boxes.csv");
        // Sorted: cat/1.png, cat/2.PNG, dog/1.png.
        assert_eq!(
            a.mask(0).unwrap(),
            [1, 1, 0, 0].repeat(4).as_slice(),
            "left half of every row"
        );
        assert!(
            a.mask(1).unwrap().iter().all(|m| *m == 1),
            "no line: all object"
        );
        for bad in [
            "cat/1.png,0,0,1\n",
            "cat/1.png,2,0,1,2\n",
            "cat/1.png,0,0,x,2\n",
        ] {
            std::fs::write(root.join("a/boxes.csv"), bad).unwrap();
            let err = imagefolder_domains(root, 3, 4, 4).unwrap_err().to_string();
            assert!(err.contains("boxes.csv:1"), "{err}");
        }
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
    fn a_site_leaves_out_and_lists_the_files_that_do_not_decode() {
        let dir = tree();
        let site = dir.path().join("a");
        let whole = imagefolder_site(&site, 3, 2, 2).unwrap();
        assert!(whole.skipped.is_empty());
        std::fs::write(site.join("cat/3.png"), b"half a png").unwrap();
        std::fs::write(site.join("dog/0.jpg"), [0xff, 0xd8, 0xff]).unwrap();
        let report = LoadReport::default();
        let loaded = imagefolder_site_reporting(&site, (3, 2, 2), &report).unwrap();
        // Counted for the status and the metrics, named inside the site folder.
        let counted = report.skipped();
        assert_eq!(counted.count, 2);
        let last = counted.last.unwrap();
        assert_eq!(last.file, "dog/0.jpg");
        assert!(last.reason.contains("replace or remove"), "{last:?}");
        assert!(!last.reason.contains(&*site.to_string_lossy()), "{last:?}");
        assert_eq!(report.loading(), None, "nothing loads once it is read");
        assert_eq!(loaded.images.labels, whole.images.labels);
        assert_eq!(loaded.images.images, whole.images.images);
        let files: Vec<&Path> = loaded.skipped.iter().map(|(f, _)| f.as_path()).collect();
        assert_eq!(files, [site.join("cat/3.png"), site.join("dog/0.jpg")]);
        assert!(
            loaded.skipped[0].1.contains("replace or remove"),
            "{:?}",
            loaded.skipped
        );
        // Nothing that decodes: still an error.
        let broken = dir.path().join("b");
        std::fs::write(broken.join("dog/x.png"), b"gone").unwrap();
        let err = imagefolder_site(&broken, 3, 2, 2).unwrap_err();
        assert!(matches!(err, DataError::EmptyDomain { .. }), "{err:?}");
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
