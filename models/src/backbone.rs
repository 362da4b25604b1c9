//! A frozen ONNX backbone run with tract.
//!
//! The model is loaded once and checked against its card with a symbolic batch dimension `N`.
//! It runs with a plan optimised for a concrete batch size, made on first use of that size and
//! kept (a short last batch is padded to it): tract only picks its fast depthwise-convolution
//! kernel when every dimension is known, which made EfficientNet-Lite0 about 20 times slower
//! with a symbolic batch. The [`ModelCard`] says how to normalise images and what comes out.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::DimLike;

use crate::card::{CardError, Layout, ModelCard};

type Plan = Arc<TypedRunnableModel>;

/// Plans kept per backbone; the oldest is dropped beyond this.
const MAX_PLANS: usize = 8;

/// Idle run states kept per plan: one per thread that runs the backbone at the same time
/// (training and inference), so a run allocates no per-node state.
const MAX_IDLE_STATES: usize = 2;

/// A plan for one batch size and run states made from it, reused between runs.
#[derive(Debug)]
struct Planned {
    batch: usize,
    plan: Plan,
    idle: Vec<TypedSimpleState>,
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

/// A loaded backbone, with its optimised plans per batch size.
#[derive(Debug, Clone)]
pub struct Backbone {
    card: ModelCard,
    /// The model with its output selected, before the input's shape is fixed.
    model: Arc<InferenceModel>,
    /// Which input the card feeds.
    input: usize,
    /// Plans made so far, by batch size, with their idle run states.
    plans: Arc<Mutex<Vec<Planned>>>,
    /// Where the model came from, for errors.
    origin: PathBuf,
    /// The card's name and the SHA-256 of the ONNX bytes, as round tasks name a backbone.
    reference: fedge_wire::BackboneRef,
}

impl Backbone {
    /// Loads the backbone a card describes (its `file` is relative to the card).
    pub fn load(card_path: &Path) -> Result<Self, BackboneError> {
        let card = ModelCard::load(card_path)?;
        let onnx_path = card.onnx_path(card_path);
        let bytes = std::fs::read(&onnx_path).map_err(|e| BackboneError::Load {
            path: onnx_path.clone(),
            message: e.to_string(),
        })?;
        Self::from_bytes(card, &bytes, &onnx_path)
    }

    /// Loads an ONNX model held in memory; `origin` only names it in errors.
    pub fn from_bytes(card: ModelCard, onnx: &[u8], origin: &Path) -> Result<Self, BackboneError> {
        let load_err = |e: TractError| BackboneError::Load {
            path: origin.to_owned(),
            message: format!("{e:#}"),
        };
        let mut model = tract_onnx::onnx()
            .model_for_read(&mut &onnx[..])
            .map_err(load_err)?;
        let batch = model.sym("N");
        let shape: TVec<TDim> = match card.layout {
            Layout::Nchw => tvec![
                batch.into(),
                card.channels.into(),
                card.height.into(),
                card.width.into()
            ],
            Layout::Nhwc => tvec![
                batch.into(),
                card.height.into(),
                card.width.into(),
                card.channels.into()
            ],
        };
        let input_names: Vec<String> = model
            .input_outlets()
            .map_err(load_err)?
            .iter()
            .map(|o| model.node(o.node).name.clone())
            .collect();
        let input = input_names
            .iter()
            .position(|n| *n == card.input_name)
            .ok_or_else(|| BackboneError::Load {
                path: origin.to_owned(),
                message: format!(
                    "the card names input {:?}, the model has {:?}",
                    card.input_name, input_names
                ),
            })?;
        model
            .select_outputs_by_name([&card.output_name])
            .map_err(|_| BackboneError::Load {
                path: origin.to_owned(),
                message: format!(
                    "the card names output {:?}, which the model does not have",
                    card.output_name
                ),
            })?;
        let unshaped = model.clone();
        model = model
            .with_input_fact(input, InferenceFact::dt_shape(f32::datum_type(), shape))
            .map_err(load_err)?;
        let typed = model.into_typed().map_err(load_err)?;
        let output = typed.output_fact(0).map_err(load_err)?.clone();
        let features = output.shape.last().and_then(|d| d.to_usize().ok());
        if features != Some(card.feature_size) || output.rank() != 2 {
            return Err(BackboneError::Load {
                path: origin.to_owned(),
                message: format!(
                    "the model's output has shape {:?}, the card promises [N, {}]",
                    output.shape, card.feature_size
                ),
            });
        }
        let backbone = Self {
            reference: fedge_wire::BackboneRef::of(&card.name, onnx),
            card,
            model: Arc::new(unshaped),
            input,
            plans: Arc::new(Mutex::new(Vec::new())),
            origin: origin.to_owned(),
        };
        let state = backbone.state(1)?;
        backbone.give_back(1, state);
        Ok(backbone)
    }

    /// A run state of the plan for batches of exactly `batch` images: an idle one, or a new
    /// one (the plan is made and kept on first use of its size).
    fn state(&self, batch: usize) -> Result<TypedSimpleState, BackboneError> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        let spawn_err = |e: TractError| BackboneError::Load {
            path: self.origin.clone(),
            message: format!("{e:#}"),
        };
        if let Some(planned) = plans.iter_mut().find(|p| p.batch == batch) {
            return match planned.idle.pop() {
                Some(state) => Ok(state),
                None => planned.plan.spawn().map_err(spawn_err),
            };
        }
        let card = &self.card;
        let shape: TVec<usize> = match card.layout {
            Layout::Nchw => tvec![batch, card.channels, card.height, card.width],
            Layout::Nhwc => tvec![batch, card.height, card.width, card.channels],
        };
        let plan = (*self.model)
            .clone()
            .with_input_fact(
                self.input,
                InferenceFact::dt_shape(f32::datum_type(), shape),
            )
            .and_then(|m| m.into_optimized())
            .and_then(|m| m.into_runnable())
            .map_err(spawn_err)?;
        if plans.len() >= MAX_PLANS {
            plans.remove(0);
        }
        let state = plan.spawn().map_err(spawn_err)?;
        plans.push(Planned {
            batch,
            plan,
            idle: Vec::new(),
        });
        Ok(state)
    }

    /// Gives a run state back for the next run of its batch size.
    fn give_back(&self, batch: usize, state: TypedSimpleState) {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(planned) = plans.iter_mut().find(|p| p.batch == batch)
            && planned.idle.len() < MAX_IDLE_STATES
        {
            planned.idle.push(state);
        }
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
            // A short last batch is padded with zeros to the plan's size.
            normalised.resize(batch * per_image, 0.0);
            let shape = match self.card.layout {
                Layout::Nchw => [batch, self.card.channels, self.card.height, self.card.width],
                Layout::Nhwc => [batch, self.card.height, self.card.width, self.card.channels],
            };
            let run_err = |e: TractError| BackboneError::Run {
                name: self.card.name.clone(),
                message: format!("{e:#}"),
            };
            let input = Tensor::from_shape(&shape, &normalised).map_err(run_err)?;
            let mut state = self.state(batch)?;
            let result = state.run(tvec!(input.into())).map_err(run_err)?;
            // A state whose run failed is dropped rather than reused.
            self.give_back(batch, state);
            let view = result[0].to_plain_array_view::<f32>().map_err(run_err)?;
            out.extend(view.iter().take(n * self.card.feature_size).copied());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::ModelCard;
    use crate::generate::{DIGITS_CONV_ONNX, digits_conv_card};

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
        let sizes: Vec<usize> = fresh
            .plans
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.batch)
            .collect();
        assert_eq!(
            sizes,
            [1, 2],
            "the load-time plan and one for batches of two"
        );
        // Each size kept one idle run state, reused by the next run of that size.
        let idle: Vec<usize> = fresh
            .plans
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.idle.len())
            .collect();
        assert_eq!(idle, [1, 1]);
        fresh.features_of(&five, (1, 4, 4), 255.0, 2).unwrap();
        let idle: Vec<usize> = fresh
            .plans
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.idle.len())
            .collect();
        assert_eq!(
            idle,
            [1, 1],
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
