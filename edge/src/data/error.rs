//! The errors of the data loaders.

use std::path::PathBuf;

/// An error while loading a data set; each message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The data set root does not exist.
    #[error(
        "data set root {} does not exist; expected root/<domain>/<class>/*.png",
        root.display()
    )]
    MissingRoot {
        /// The root that was given.
        root: PathBuf,
    },
    /// The data set root is a file, not a folder.
    #[error(
        "data set root {} is not a folder; expected root/<domain>/<class>/*.png",
        root.display()
    )]
    RootNotAFolder {
        /// The root that was given.
        root: PathBuf,
    },
    /// The data set root has no domain folders.
    #[error(
        "data set root {} has no domain folders; expected root/<domain>/<class>/*.png",
        root.display()
    )]
    NoDomains {
        /// The root that was given.
        root: PathBuf,
    },
    /// A domain folder holds no images in any class folder.
    #[error(
        "domain folder {} has no images; put .png, .jpg or .jpeg files into {}/<class>/",
        path.display(),
        path.display()
    )]
    EmptyDomain {
        /// The domain folder.
        path: PathBuf,
    },
    /// An IDX file is malformed.
    #[error("{}: {reason}", path.display())]
    BadIdx {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A `boxes.csv` line is malformed.
    #[error("{}:{line}: {reason}; lines are file,x1,y1,x2,y2 with file relative to the domain folder (class/name.png) and pixel coordinates of the original image", path.display())]
    BadBoxes {
        /// The file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Fashion-MNIST is not where it was looked for.
    #[error(
        "Fashion-MNIST not found in {}: install the Debian package (apt-get install dataset-fashion-mnist, files in /usr/share/datasets/fashion-mnist) or pass --data-dir DIR holding train-images-idx3-ubyte.gz and the three other IDX files",
        dir.display()
    )]
    MissingFashionMnist {
        /// The folder searched.
        dir: PathBuf,
    },
    /// A file or folder could not be read.
    #[error("cannot read {}: {source}; check that it exists and is readable", path.display())]
    Io {
        /// The file or folder that could not be read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An image file could not be decoded.
    #[error(
        "cannot decode image file {}: {source}; replace or remove the file",
        path.display()
    )]
    Decode {
        /// The file that could not be decoded.
        path: PathBuf,
        /// The underlying error.
        source: image::ImageError,
    },
    /// The requested channel count is neither 1 nor 3.
    #[error("unsupported channel count {channels}; use 1 (grayscale) or 3 (RGB)")]
    UnsupportedChannels {
        /// The channel count that was requested.
        channels: usize,
    },
    /// The requested image size is zero or too large.
    #[error(
        "unsupported image size {height}x{width}; height and width must be between 1 and {}",
        u32::MAX
    )]
    InvalidSize {
        /// The requested height.
        height: usize,
        /// The requested width.
        width: usize,
    },
}

impl DataError {
    /// Why a file was left out, without its path (which a device's status does not carry: it
    /// names the file relative to its site folder).
    pub fn file_reason(&self) -> String {
        match self {
            DataError::Decode { source, .. } => format!("{source}; replace or remove the file"),
            DataError::Io { source, .. } => {
                format!("{source}; check that it exists and is readable")
            }
            other => other.to_string(),
        }
    }
}
