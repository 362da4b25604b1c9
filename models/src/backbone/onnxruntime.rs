//! The backbone in ONNX Runtime, loaded from an installed library at run time (`ort`'s
//! `load-dynamic`): nothing of ONNX Runtime is linked into the binary. One library per process;
//! the execution providers are registered one by one in the profile's order, and each one
//! the library lacks or cannot start is skipped with its reason.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::environment::Environment;
use ort::ep::ExecutionProvider;
use ort::session::Session;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::value::TensorRef;

use crate::card::{Layout, ModelCard};
use crate::runtime::{Provider, Runtime, RuntimeConfig, RuntimeReport};

/// The library this process loaded and its environment: ONNX Runtime is loaded once per
/// process (a failed attempt leaves nothing behind, so a corrected path can be tried next).
static LOADED: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

/// The library a profile names, else `ORT_DYLIB_PATH`, else the loader's search.
fn library_path(config: &RuntimeConfig) -> PathBuf {
    config
        .onnxruntime_library
        .clone()
        .or_else(|| std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("libonnxruntime.so"))
}

/// Loads the library once per process; a later profile naming another file is an error.
fn load_library(path: &Path) -> Result<Environment, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((first, environment)) = &*loaded {
        return if first == path {
            Ok(environment.clone())
        } else {
            Err(format!(
                "this process already loaded ONNX Runtime from {}; one library per process",
                first.display()
            ))
        };
    }
    let hint = |e: String| {
        format!(
            "cannot load the ONNX Runtime library {}: {e} (set [model] onnxruntime_library to \
             libonnxruntime.so.1.x, e.g. the onnxruntime Python wheel's \
             onnxruntime/capi/libonnxruntime.so.1.x)",
            path.display()
        )
    };
    let environment = ort::init_from(path)
        .map_err(|e| hint(e.to_string()))?
        .with_name("fedge")
        .with_telemetry(false)
        .build()
        .map_err(|e| hint(e.to_string()))?;
    *loaded = Some((path.to_owned(), environment.clone()));
    Ok(environment)
}

/// ONNX Runtime's version, from the library's file name (`libonnxruntime.so.1.32.0`, links
/// followed) or its build string (`git-branch=rel-1.32.0`); `None` when neither says.
fn version(library: &Path, info: &str) -> Option<String> {
    let file = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_owned());
    let from_name = file
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split(".so.").nth(1))
        .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()));
    let from_info = info
        .split("rel-")
        .nth(1)
        .and_then(|rest| rest.split([',', ' ']).next());
    from_name.or(from_info).map(str::to_string)
}

/// A session on the backbone and what it runs on.
#[derive(Debug)]
pub(super) struct OrtEngine {
    session: Mutex<Session>,
    output: String,
    pub(super) report: RuntimeReport,
}

fn message(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Registers `provider` on the session, or says why it cannot be.
fn register(provider: Provider, builder: &mut SessionBuilder) -> Result<(), String> {
    fn try_one<E: ExecutionProvider>(ep: E, builder: &mut SessionBuilder) -> Result<(), String> {
        if !E::is_available().map_err(message)? {
            return Err("not in this ONNX Runtime library".into());
        }
        ep.register(builder).map_err(message)
    }
    match provider {
        Provider::Cpu => try_one(ort::ep::CPU::default(), builder),
        Provider::Cuda => try_one(ort::ep::CUDA::default(), builder),
        Provider::Tensorrt => try_one(ort::ep::TensorRT::default(), builder),
    }
}

impl OrtEngine {
    /// A session on `onnx` with the profile's providers and `threads` threads per run (0: ONNX
    /// Runtime's default), checked against the card with one run of a blank image.
    pub(super) fn load(
        card: &ModelCard,
        onnx: &[u8],
        config: &RuntimeConfig,
        threads: usize,
    ) -> Result<Self, String> {
        let library = library_path(config);
        let environment = load_library(&library)?;
        let mut builder = Session::builder(&environment)
            .map_err(message)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(message)?;
        if threads > 0 {
            builder = builder
                .with_intra_threads(threads)
                .map_err(message)?
                .with_inter_threads(1)
                .map_err(message)?;
        }
        let mut providers = Vec::new();
        let mut skipped = Vec::new();
        for &provider in &config.providers {
            match register(provider, &mut builder) {
                Ok(()) => providers.push(provider),
                Err(reason) => skipped.push(format!("{provider} skipped: {reason}")),
            }
        }
        // ONNX Runtime runs whatever no provider took on its CPU kernels.
        if !providers.contains(&Provider::Cpu) {
            providers.push(Provider::Cpu);
        }
        let session = builder.commit_from_memory(onnx).map_err(message)?;
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        if !inputs.contains(&card.input_name.as_str()) {
            return Err(format!(
                "the card names input {:?}, the model has {:?}",
                card.input_name, inputs
            ));
        }
        if !session
            .outputs()
            .iter()
            .any(|o| o.name() == card.output_name)
        {
            return Err(format!(
                "the card names output {:?}, which the model does not have",
                card.output_name
            ));
        }
        let engine = Self {
            session: Mutex::new(session),
            output: card.output_name.clone(),
            report: RuntimeReport {
                runtime: Runtime::Onnxruntime,
                version: version(&library, ort::info()),
                providers,
                skipped,
            },
        };
        let blank = vec![0.0; card.input_len()];
        let out = engine.run(card, &blank, 1)?;
        if out.len() != card.feature_size {
            return Err(format!(
                "the model gives {} values per image, the card promises {}",
                out.len(),
                card.feature_size
            ));
        }
        Ok(engine)
    }

    /// Runs one batch of `batch` normalised images; returns `batch × feature_size` values.
    pub(super) fn run(
        &self,
        card: &ModelCard,
        normalised: &[f32],
        batch: usize,
    ) -> Result<Vec<f32>, String> {
        let shape = match card.layout {
            Layout::Nchw => [batch, card.channels, card.height, card.width],
            Layout::Nhwc => [batch, card.height, card.width, card.channels],
        };
        let input = TensorRef::from_array_view((shape, normalised)).map_err(message)?;
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let outputs = session
            .run(ort::inputs![card.input_name.as_str() => input])
            .map_err(message)?;
        let (_, values) = outputs[self.output.as_str()]
            .try_extract_tensor::<f32>()
            .map_err(message)?;
        Ok(values.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_comes_from_the_file_name_or_the_build_string() {
        let named = Path::new("capi/libonnxruntime.so.1.32.0");
        assert_eq!(
            version(named, "ORT Build Info: git-branch=HEAD").as_deref(),
            Some("1.32.0")
        );
        let bare = Path::new("libonnxruntime.so");
        let info = "ORT Build Info: git-branch=rel-1.20.1, git-commit-id=5c1b7cc";
        assert_eq!(version(bare, info).as_deref(), Some("1.20.1"));
        assert_eq!(version(bare, "ORT Build Info: git-branch=HEAD"), None);
    }
}
