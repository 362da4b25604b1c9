//! IDX files (the MNIST family's format, optionally gzip-compressed) and rotated Fashion-MNIST
//! domains built from them.

use std::io::Read;
use std::path::{Path, PathBuf};

use fedge_edge::data::{DataError, Domain, ImageSet, rotated_domains};

/// Where Debian's `dataset-fashion-mnist` package puts the files.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

const FASHION_CLASSES: [&str; 10] = [
    "t-shirt",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle-boot",
];

/// Reads an IDX file of unsigned bytes (gzip-compressed or not): its dimensions and values.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let io = |source| DataError::Io {
        path: path.to_owned(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(io)?;
        out
    } else {
        raw
    };
    parse_idx(&bytes).map_err(|e| DataError::BadIdx {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Why bytes are not an IDX file of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum IdxError {
    #[error("not an IDX file (bad magic)")]
    Magic,
    #[error("element type 0x{0:02x}, only unsigned bytes (0x08) are supported")]
    ElementType(u8),
    #[error("truncated header")]
    Header,
    #[error("dimensions overflow")]
    Overflow,
    #[error("{announced} values announced, {present} present")]
    Count { announced: usize, present: usize },
}

fn parse_idx(bytes: &[u8]) -> Result<(Vec<usize>, Vec<u8>), IdxError> {
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(IdxError::Magic);
    }
    if bytes[2] != 0x08 {
        return Err(IdxError::ElementType(bytes[2]));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(IdxError::Header);
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| {
            let b = &bytes[4 + 4 * i..8 + 4 * i];
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
        })
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d))
        .ok_or(IdxError::Overflow)?;
    if bytes.len() - header != count {
        return Err(IdxError::Count {
            announced: count,
            present: bytes.len() - header,
        });
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// Rotated Fashion-MNIST domains: `limit` images (all 70,000 if `None`) drawn at random with
/// `seed` from the train and test files in `dir` (see [`fashion_mnist`]), split into disjoint
/// class-stratified parts and rotated by `angles` (named `rot<angle>`).
pub fn fashion_mnist_domains(
    dir: &Path,
    angles: &[f32],
    seed: u64,
    limit: Option<usize>,
    side: usize,
) -> Result<Vec<Domain>, DataError> {
    Ok(rotated_domains(
        &fashion_mnist(dir, seed, limit, side)?,
        angles,
        seed,
    ))
}

/// Fashion-MNIST as one set: `limit` images (all 70,000 if `None`) drawn at random with `seed`
/// from the train and test files in `dir` (gzipped or not), shrunk to `side × side` by area
/// averaging, kept on the 8-bit scale 0..=255 (a backbone's card rescales them).
pub fn fashion_mnist(
    dir: &Path,
    seed: u64,
    limit: Option<usize>,
    side: usize,
) -> Result<ImageSet, DataError> {
    let file = |name: &str| -> PathBuf { dir.join(name) };
    if !file("train-images-idx3-ubyte.gz").exists() && !file("train-images-idx3-ubyte").exists() {
        return Err(DataError::MissingFashionMnist {
            dir: dir.to_owned(),
        });
    }
    let pick = |stem: &str| {
        let gz = file(&format!("{stem}.gz"));
        if gz.exists() { gz } else { file(stem) }
    };
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for split in ["train", "t10k"] {
        let (idims, ivals) = read_idx(&pick(&format!("{split}-images-idx3-ubyte")))?;
        let (ldims, lvals) = read_idx(&pick(&format!("{split}-labels-idx1-ubyte")))?;
        if idims.len() != 3 || ldims.len() != 1 || idims[0] != ldims[0] {
            return Err(DataError::BadIdx {
                path: pick(&format!("{split}-images-idx3-ubyte")),
                reason: format!("image dims {idims:?} do not match label dims {ldims:?}"),
            });
        }
        let (h, w) = (idims[1], idims[2]);
        for (i, &label) in lvals.iter().enumerate() {
            if label as usize >= FASHION_CLASSES.len() {
                return Err(DataError::BadIdx {
                    path: pick(&format!("{split}-labels-idx1-ubyte")),
                    reason: format!("label {label} out of range"),
                });
            }
            images.push(shrink(&ivals[i * h * w..(i + 1) * h * w], h, w, side));
            labels.push(label as u32);
        }
    }
    let all = ImageSet {
        channels: 1,
        height: side,
        width: side,
        class_names: FASHION_CLASSES.iter().map(|s| s.to_string()).collect(),
        images: images.concat(),
        labels,
        raw_max: 255.0,
        masks: None,
    };
    Ok(match limit {
        Some(n) if n < all.len() => all.partition(all.len().div_ceil(n), seed ^ 0xfa5)[0].clone(),
        _ => all,
    })
}

/// Area-averages an `h × w` byte image to `side × side` (a copy when `side` equals both).
fn shrink(pixels: &[u8], h: usize, w: usize, side: usize) -> Vec<f32> {
    let mut out = vec![0f32; side * side];
    for r in 0..side {
        let (r0, r1) = (r * h / side, ((r + 1) * h / side).max(r * h / side + 1));
        for c in 0..side {
            let (c0, c1) = (c * w / side, ((c + 1) * w / side).max(c * w / side + 1));
            let mut sum = 0u32;
            for y in r0..r1 {
                for x in c0..c1 {
                    sum += pixels[y * w + x] as u32;
                }
            }
            let n = ((r1 - r0) * (c1 - c0)) as f32;
            out[r * side + c] = sum as f32 / n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn idx(dims: &[u32], values: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 0x08, dims.len() as u8];
        for d in dims {
            out.extend(d.to_be_bytes());
        }
        out.extend(values);
        out
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn idx_files_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_idx(&idx(&[2, 2], &[1, 2, 3, 4])).unwrap(),
            (vec![2, 2], vec![1, 2, 3, 4])
        );
        assert_eq!(
            parse_idx(&idx(&[2, 2], &[1, 2, 3])),
            Err(IdxError::Count {
                announced: 4,
                present: 3
            })
        );
        assert!(
            parse_idx(b"PK\x03\x04")
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
        let mut float = idx(&[1], &[0, 0, 0, 0]);
        float[2] = 0x0d;
        assert!(
            parse_idx(&float)
                .unwrap_err()
                .to_string()
                .contains("unsigned bytes")
        );
        for cut in 0..12 {
            let _ = parse_idx(&idx(&[2, 2], &[1, 2, 3, 4])[..cut]);
        }
    }

    #[test]
    fn fashion_mnist_domains_from_a_small_fake_set() {
        let dir = tempfile::tempdir().unwrap();
        // 60 "train" and 12 "t10k" 28×28 images whose pixels encode their label.
        for (split, n) in [("train", 60u32), ("t10k", 12)] {
            let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
            let pixels: Vec<u8> = labels.iter().flat_map(|&l| vec![l * 20; 28 * 28]).collect();
            std::fs::write(
                dir.path().join(format!("{split}-images-idx3-ubyte.gz")),
                gz(&idx(&[n, 28, 28], &pixels)),
            )
            .unwrap();
            std::fs::write(
                dir.path().join(format!("{split}-labels-idx1-ubyte.gz")),
                gz(&idx(&[n], &labels)),
            )
            .unwrap();
        }
        let domains = fashion_mnist_domains(dir.path(), &[0.0, 30.0], 1, None, 8).unwrap();
        assert_eq!(domains.len(), 2);
        assert_eq!(domains.iter().map(|d| d.data.len()).sum::<usize>(), 72);
        let d0 = &domains[0].data;
        assert_eq!((d0.height, d0.width, d0.class_names.len()), (8, 8, 10));
        for i in 0..d0.len() {
            let want = d0.labels[i] as f32 * 20.0;
            assert!(
                d0.image(i).iter().all(|v| (v - want).abs() < 1e-4),
                "unrotated domain keeps the shrunk pixels"
            );
        }
        let limited = fashion_mnist_domains(dir.path(), &[0.0, 30.0], 1, Some(36), 8).unwrap();
        assert_eq!(limited.iter().map(|d| d.data.len()).sum::<usize>(), 36);
        let missing =
            fashion_mnist_domains(&dir.path().join("nope"), &[0.0], 1, None, 8).unwrap_err();
        assert!(
            missing.to_string().contains("dataset-fashion-mnist"),
            "{missing}"
        );
    }
}
