//! Reading and writing 1-D little-endian f32 arrays in numpy's `.npy` format (versions 1–3),
//! for offline replay of a round (`fedge-coordinator aggregate`).

use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// What is wrong with bytes that should be a 1-D f32 `.npy` array; each message says what to
/// change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NpyError {
    /// No `\x93NUMPY` magic.
    #[error("not a .npy file (no \\x93NUMPY magic)")]
    NotNpy,
    /// A format version other than 1, 2 or 3.
    #[error(".npy format version {0} is not supported")]
    Version(u8),
    /// The header runs past the end of the file.
    #[error("truncated .npy header")]
    Truncated,
    /// The header is not UTF-8.
    #[error("header is not text")]
    HeaderNotText,
    /// A key the header must have.
    #[error("header has no '{0}'")]
    MissingKey(&'static str),
    /// Another element type.
    #[error(
        "dtype {0}, expected little-endian float32 ('<f4'); save with np.asarray(x, dtype=np.float32)"
    )]
    Dtype(String),
    /// Column-major data.
    #[error("Fortran-ordered arrays are not supported")]
    FortranOrder,
    /// A shape that does not parse.
    #[error("bad shape {0}")]
    BadShape(String),
    /// More or fewer than one dimension.
    #[error("shape ({0}) but a 1-D vector is needed; flatten it with x.ravel()")]
    NotOneDimensional(String),
    /// The data's length differs from the shape's.
    #[error("{len} values announced, {bytes} bytes of data present")]
    Length {
        /// Values the shape announces.
        len: usize,
        /// Bytes of data present.
        bytes: usize,
    },
}

/// A `.npy` file that cannot be read or written; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum NpyFileError {
    /// File system error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Not a 1-D f32 array.
    #[error("{}: {source}", path.display())]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        source: NpyError,
    },
}

/// Parses a `.npy` file holding a 1-D `<f4` array; the error says what to change.
pub fn parse_f32(bytes: &[u8]) -> Result<Vec<f32>, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(NpyError::NotNpy);
    }
    let major = bytes[6];
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(NpyError::Version(major)),
    };
    let end = start
        .checked_add(header_len)
        .filter(|e| *e <= bytes.len())
        .ok_or(NpyError::Truncated)?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| NpyError::HeaderNotText)?;
    let descr = value_of(header, "descr").ok_or(NpyError::MissingKey("descr"))?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    if descr != "<f4" && !(descr == "=f4" && cfg!(target_endian = "little")) {
        return Err(NpyError::Dtype(descr.to_owned()));
    }
    if value_of(header, "fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(NpyError::FortranOrder);
    }
    let shape = value_of(header, "shape").ok_or(NpyError::MissingKey("shape"))?;
    let dims: Vec<usize> = shape
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| NpyError::BadShape(shape.to_owned()))
        })
        .collect::<Result<_, _>>()?;
    let [len] = dims[..] else {
        let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
        return Err(NpyError::NotOneDimensional(dims.join(", ")));
    };
    let data = &bytes[end..];
    if data.len() != len * 4 {
        return Err(NpyError::Length {
            len,
            bytes: data.len(),
        });
    }
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The text after `'key':` up to the next top-level comma (a tuple counts as one value).
fn value_of<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = header[at + key.len() + 2..].trim_start();
    let rest = rest.strip_prefix(':')?.trim_start();
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(rest[..i].trim()),
            _ => {}
        }
    }
    Some(rest.trim())
}

/// A `.npy` (version 1.0) file holding `values` as a 1-D `<f4` array.
pub fn to_bytes(values: &[f32]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        values.len()
    );
    // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend([1, 0]);
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    for v in values {
        out.extend(v.to_le_bytes());
    }
    out
}

/// Reads a 1-D f32 `.npy` file; errors name the file.
pub fn read_f32(path: &Path) -> Result<Vec<f32>, NpyFileError> {
    let bytes = std::fs::read(path).map_err(|source| NpyFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_f32(&bytes).map_err(|source| NpyFileError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// Writes a 1-D f32 `.npy` file.
pub fn write_f32(path: &Path, values: &[f32]) -> Result<(), NpyFileError> {
    std::fs::write(path, to_bytes(values)).map_err(|source| NpyFileError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back() {
        let values = [1.5f32, -2.0, 0.0, f32::MAX];
        let bytes = to_bytes(&values);
        assert_eq!(
            (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
            0
        );
        assert_eq!(parse_f32(&bytes).unwrap(), values);
        assert_eq!(parse_f32(&to_bytes(&[])).unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn files_numpy_writes_are_read() {
        // np.save of np.arange(3, dtype=np.float32), format 1.0, and the same in format 2.0.
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
        let mut v1 = MAGIC.to_vec();
        v1.extend([1, 0]);
        v1.extend((header.len() as u16 + 1).to_le_bytes());
        v1.extend(header.as_bytes());
        v1.push(b'\n');
        let mut v2 = MAGIC.to_vec();
        v2.extend([2, 0]);
        v2.extend((header.len() as u32 + 1).to_le_bytes());
        v2.extend(header.as_bytes());
        v2.push(b'\n');
        for file in [&mut v1, &mut v2] {
            for x in [0f32, 1.0, 2.0] {
                file.extend(x.to_le_bytes());
            }
            assert_eq!(parse_f32(file).unwrap(), vec![0.0, 1.0, 2.0]);
        }
    }

    #[test]
    fn wrong_inputs_say_what_to_change() {
        let edit = |bytes: Vec<u8>, from: &str, to: &str| -> Vec<u8> {
            let at = bytes
                .windows(from.len())
                .position(|w| w == from.as_bytes())
                .unwrap();
            [&bytes[..at], to.as_bytes(), &bytes[at + from.len()..]].concat()
        };
        let err = parse_f32(&edit(to_bytes(&[1.0]), "<f4", "<f8")).unwrap_err();
        assert!(err.to_string().contains("float32"), "{err}");
        let two_d = edit(to_bytes(&[1.0, 2.0]), "(2,)", "(1, 2)");
        assert!(parse_f32(&two_d).unwrap_err().to_string().contains("ravel"));
        let mut short = to_bytes(&[1.0, 2.0]);
        short.pop();
        assert!(matches!(parse_f32(&short), Err(NpyError::Length { .. })));
        assert!(
            parse_f32(b"PK\x03\x04 zip")
                .unwrap_err()
                .to_string()
                .contains("not a .npy")
        );
        for cut in 0..20 {
            let _ = parse_f32(&to_bytes(&[1.0])[..cut]);
        }
    }
}
