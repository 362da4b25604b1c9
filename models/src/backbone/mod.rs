//! A frozen ONNX backbone, run with tract ([`tract`], built into every binary) or ONNX Runtime
//! ([`onnxruntime`], the `onnxruntime` feature), as the device's `[model] runtime` says. The
//! [`ModelCard`] says how to normalise images and what comes out; both engines are fed the
//! same normalised batches.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::card::{CardError, ModelCard};
use crate::runtime::{Runtime, RuntimeConfig, RuntimeReport};

#[cfg(feature = "onnxruntime")]
mod onnxruntime;
mod tract;

/// The engine a backbone was loaded into.
#[derive(Debug)]
enum Engine {
    Tract(tract::TractEngine),
    #[cfg(feature = "onnxruntime")]
    Onnxruntime(onnxruntime::OrtEngine),
}

/// Why a backbone could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum BackboneError {
    /// The card is unreadable or invalid.
    #[error(transparent)]
    Card(#[from] CardError),
    /// tract could not load or optimise the ONNX model.
    #[error("cannot load backbone {path}: {message}")]
    Load {
        /// ONNX file.
        path: PathBuf,
        /// tract's message, with its causes.
        message: String,
    },
    /// The profile asks for ONNX Runtime and this binary has no `onnxruntime` feature.
    #[error(
        "this build has no ONNX Runtime support: build fedge-edge with `--features onnxruntime`, \
         or set [model] runtime = \"tract\""
    )]
    NotBuilt,
    /// Running the model failed.
    #[error("backbone {name} failed: {message}")]
    Run {
        /// Card name.
        name: String,
        /// tract's message.
        message: String,
    },
    /// The images cannot be brought to the card's input.
    #[error("backbone {name}: {source}")]
    Adapt {
        /// Card name.
        name: String,
        /// What does not fit.
        source: crate::card::AdaptError,
    },
    /// The input does not have the card's size.
    #[error(
        "backbone {name} expects {expected} values per image, got {got} values for {images} images"
    )]
    InputSize {
        /// Card name.
        name: String,
        /// Values per image.
        expected: usize,
        /// Values given.
        got: usize,
        /// Images claimed.
        images: usize,
    },
}

/// A loaded backbone and the engine that runs it.
#[derive(Debug, Clone)]
pub struct Backbone {
    card: ModelCard,
    engine: Arc<Engine>,
    /// Where the model came from, for errors.
    origin: PathBuf,
    /// The card's name and the SHA-256 of the ONNX bytes, as round tasks name a backbone.
    reference: fedge_wire::BackboneRef,
}

impl Backbone {
    /// Loads the backbone a card describes (its `file` is relative to the card) into tract, on
    /// one thread.
    pub fn load(card_path: &Path) -> Result<Self, BackboneError> {
        Self::load_with(card_path, &RuntimeConfig::tract(), 1)
    }

    /// Loads an ONNX model held in memory into tract, on one thread; `origin` only names it in
    /// errors.
    pub fn from_bytes(card: ModelCard, onnx: &[u8], origin: &Path) -> Result<Self, BackboneError> {
        Self::from_bytes_with(card, onnx, origin, &RuntimeConfig::tract(), 1)
    }

    /// Loads the backbone a card describes into the engine `runtime` names, with `threads`
    /// threads per run (0: one per core; tract uses one thread unless built with the
    /// `tract-threads` feature).
    pub fn load_with(
        card_path: &Path,
        runtime: &RuntimeConfig,
        threads: usize,
    ) -> Result<Self, BackboneError> {
        let card = ModelCard::load(card_path)?;
        let onnx_path = card.onnx_path(card_path);
        let bytes = std::fs::read(&onnx_path).map_err(|e| BackboneError::Load {
            path: onnx_path.clone(),
            message: e.to_string(),
        })?;
        Self::from_bytes_with(card, &bytes, &onnx_path, runtime, threads)
    }

    /// Loads an ONNX model held in memory into the engine `runtime` names.
    pub fn from_bytes_with(
        card: ModelCard,
        onnx: &[u8],
        origin: &Path,
        runtime: &RuntimeConfig,
        threads: usize,
    ) -> Result<Self, BackboneError> {
        let load_err = |message: String| BackboneError::Load {
            path: origin.to_owned(),
            message,
        };
        let engine = match runtime.runtime {
            Runtime::Tract => {
                Engine::Tract(tract::TractEngine::load(&card, onnx, threads).map_err(load_err)?)
            }
            #[cfg(feature = "onnxruntime")]
            Runtime::Onnxruntime => Engine::Onnxruntime(
                onnxruntime::OrtEngine::load(&card, onnx, runtime, threads).map_err(load_err)?,
            ),
            #[cfg(not(feature = "onnxruntime"))]
            Runtime::Onnxruntime => return Err(BackboneError::NotBuilt),
        };
        Ok(Self {
            reference: fedge_wire::BackboneRef::of(&card.name, onnx),
            card,
            engine: Arc::new(engine),
            origin: origin.to_owned(),
        })
    }

    /// What a backbone in tract reports.
    pub fn tract_report() -> RuntimeReport {
        RuntimeReport {
            runtime: Runtime::Tract,
            version: None,
            providers: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// The engine and, for ONNX Runtime, its version and execution providers.
    pub fn runtime(&self) -> RuntimeReport {
        match &*self.engine {
            Engine::Tract(_) => Self::tract_report(),
            #[cfg(feature = "onnxruntime")]
            Engine::Onnxruntime(engine) => engine.report.clone(),
        }
    }

    /// Where the model was loaded from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The card's name and the SHA-256 of the ONNX file.
    pub fn reference(&self) -> &fedge_wire::BackboneRef {
        &self.reference
    }

    /// The card.
    pub fn card(&self) -> &ModelCard {
        &self.card
    }

    /// Features of images of any size and channel count, each `shape = (c, h, w)` raw values
    /// on the scale `0..=source_max`, packed: every image is first brought to the card's input
    /// by [`ModelCard::adapt_chw`] (resized, channels replicated or averaged, rescaled), a batch
    /// at a time. Returns `images × feature_size` values.
    pub fn features_of(
        &self,
        raw_chw: &[f32],
        shape: (usize, usize, usize),
        source_max: f32,
        batch: usize,
    ) -> Result<Vec<f32>, BackboneError> {
        let card = &self.card;
        if shape == (card.channels, card.height, card.width) && source_max == card.raw_max {
            return self.features(raw_chw, batch);
        }
        let per_image = shape.0 * shape.1 * shape.2;
        if per_image == 0 || !raw_chw.len().is_multiple_of(per_image) {
            return Err(BackboneError::Adapt {
                name: card.name.clone(),
                source: crate::card::AdaptError::NotWholeImages {
                    values: raw_chw.len(),
                    shape,
                },
            });
        }
        let images = raw_chw.len() / per_image;
        let plan_batch = batch.clamp(1, images.max(1));
        let mut out = Vec::with_capacity(images * card.feature_size);
        let mut adapted = Vec::with_capacity(plan_batch * card.input_len());
        for chunk in raw_chw.chunks(plan_batch * per_image) {
            adapted.clear();
            for image in chunk.chunks_exact(per_image) {
                card.adapt_chw(image, shape, source_max, &mut adapted)
                    .map_err(|source| BackboneError::Adapt {
                        name: card.name.clone(),
                        source,
                    })?;
            }
            out.extend(self.run_batches(&adapted, plan_batch)?);
        }
        Ok(out)
    }

    /// Features of `images`, each `[C, H, W]` raw values (before the card's scaling), packed.
    /// Returns `images × feature_size` values, row-major. Runs in batches of `batch` images.
    pub fn features(&self, raw_chw: &[f32], batch: usize) -> Result<Vec<f32>, BackboneError> {
        let per_image = self.card.input_len();
        let images = raw_chw.len() / per_image.max(1);
        if images * per_image != raw_chw.len() {
            return Err(BackboneError::InputSize {
                name: self.card.name.clone(),
                expected: per_image,
                got: raw_chw.len(),
                images,
            });
        }
        // No plan larger than the work: a small call gets a plan of its own size.
        self.run_batches(raw_chw, batch.clamp(1, images.max(1)))
    }

    /// Runs card-shaped raw images through the plan for `batch` images, chunk by chunk; a short
    /// last chunk is padded, so every chunk of every call with the same `batch` shares one plan.
    fn run_batches(&self, raw_chw: &[f32], batch: usize) -> Result<Vec<f32>, BackboneError> {
        let per_image = self.card.input_len();
        let mut out = Vec::with_capacity(raw_chw.len() / per_image * self.card.feature_size);
        let mut normalised = Vec::with_capacity(batch * per_image);
        for chunk in raw_chw.chunks(batch * per_image) {
            normalised.clear();
            for image in chunk.chunks_exact(per_image) {
                self.card.normalise_chw(image, &mut normalised);
            }
            let n = chunk.len() / per_image;
            let run_err = |message: String| BackboneError::Run {
                name: self.card.name.clone(),
                message,
            };
            let values = match &*self.engine {
                Engine::Tract(engine) => {
                    // A short last batch is padded with zeros to the plan's size.
                    normalised.resize(batch * per_image, 0.0);
                    engine.run(&self.card, &normalised, batch)
                }
                // ONNX Runtime takes any batch size: the short last batch runs as it is.
                #[cfg(feature = "onnxruntime")]
                Engine::Onnxruntime(engine) => engine.run(&self.card, &normalised, n),
            }
            .map_err(run_err)?;
            out.extend(values.iter().take(n * self.card.feature_size).copied());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::ModelCard;
    use crate::generate::{DIGITS_CONV_ONNX, digits_conv_card};

    /// (batch size, idle run states) of every tract plan made so far.
    fn plans(backbone: &Backbone) -> Vec<(usize, usize)> {
        match &*backbone.engine {
            Engine::Tract(engine) => engine
                .plans
                .lock()
                .unwrap()
                .iter()
                .map(|p| (p.batch, p.idle.len()))
                .collect(),
            #[cfg(feature = "onnxruntime")]
            Engine::Onnxruntime(_) => unreachable!("a tract backbone"),
        }
    }

    fn digits() -> Backbone {
        Backbone::from_bytes(
            digits_conv_card(),
            DIGITS_CONV_ONNX,
            Path::new("digits-conv.onnx"),
        )
        .unwrap()
    }

    #[test]
    fn digits_backbone_gives_512_finite_features_per_image_independent_of_batching() {
        let backbone = digits();
        let images: Vec<f32> = (0..5 * 64).map(|i| (i * 7 % 17) as f32).collect();
        let all = backbone.features(&images, 64).unwrap();
        let one_by_one = backbone.features(&images, 1).unwrap();
        assert_eq!(all.len(), 5 * 512);
        assert!(all.iter().all(|v| v.is_finite() && *v >= 0.0));
        assert!(all.iter().any(|v| *v > 0.0));
        for (a, b) in all.iter().zip(&one_by_one) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()));
        }
    }

    #[cfg(feature = "tract-threads")]
    #[test]
    fn tract_on_several_threads_gives_the_features_of_one() {
        let two = Backbone::from_bytes_with(
            digits_conv_card(),
            DIGITS_CONV_ONNX,
            Path::new("digits-conv.onnx"),
            &RuntimeConfig::tract(),
            2,
        )
        .unwrap();
        assert!(matches!(&*two.engine, Engine::Tract(e) if e.threaded()));
        let images: Vec<f32> = (0..37 * 64).map(|i| (i * 7 % 17) as f32).collect();
        let one = digits().features(&images, 37).unwrap();
        let both = two.features(&images, 37).unwrap();
        for (a, b) in one.iter().zip(&both) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} {b}");
        }
    }

    #[test]
    fn loads_from_card_file_and_rejects_a_card_that_lies_about_features() {
        let dir = tempfile::tempdir().unwrap();
        let card_path = crate::generate::write_digits_conv(dir.path()).unwrap();
        assert_eq!(Backbone::load(&card_path).unwrap().card().feature_size, 512);
        let mut card = digits_conv_card();
        card.feature_size = 100;
        let err = Backbone::from_bytes(card, DIGITS_CONV_ONNX, Path::new("x.onnx")).unwrap_err();
        assert!(err.to_string().contains("card promises"), "{err}");
        for (input, output, expected) in [
            ("pixels", "features", "names input"),
            ("input", "logits", "names output"),
        ] {
            let card = ModelCard {
                input_name: input.into(),
                output_name: output.into(),
                ..digits_conv_card()
            };
            let err =
                Backbone::from_bytes(card, DIGITS_CONV_ONNX, Path::new("x.onnx")).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn adapted_images_give_the_features_of_the_adapted_input() {
        let backbone = digits();
        // Two 1x4x4 images on 0..=255 against their 8x8 versions on 0..=16, made by the card.
        let raw: Vec<f32> = (0..32).map(|v| (v * 8) as f32).collect();
        let mut adapted = Vec::new();
        for image in raw.chunks(16) {
            backbone
                .card()
                .adapt_chw(image, (1, 4, 4), 255.0, &mut adapted)
                .unwrap();
        }
        let direct = backbone.features(&adapted, 8).unwrap();
        assert_eq!(
            backbone.features_of(&raw, (1, 4, 4), 255.0, 1).unwrap(),
            direct
        );
        // Five images in batches of two: the short last batch is padded, so one plan serves all.
        let five: Vec<f32> = raw.iter().cycle().take(5 * 16).copied().collect();
        let fresh = digits();
        let got = fresh.features_of(&five, (1, 4, 4), 255.0, 2).unwrap();
        assert_eq!(&got[..2 * 512], &direct[..], "same features when padded");
        // The load-time plan and one for batches of two; each size kept one idle run state.
        assert_eq!(plans(&fresh), [(1, 1), (2, 1)]);
        fresh.features_of(&five, (1, 4, 4), 255.0, 2).unwrap();
        assert_eq!(
            plans(&fresh),
            [(1, 1), (2, 1)],
            "the state was taken and given back, not a new one kept"
        );
        let err = backbone
            .features_of(&raw[..30], (1, 4, 4), 255.0, 1)
            .unwrap_err();
        assert!(err.to_string().contains("whole"), "{err}");
    }

    #[test]
    fn wrong_input_size_is_an_error() {
        let err = digits().features(&[0.0; 65], 8).unwrap_err();
        assert!(matches!(err, BackboneError::InputSize { .. }), "{err}");
    }
}
