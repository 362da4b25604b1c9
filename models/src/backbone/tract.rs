//! The backbone in tract: the model is checked against its card with a symbolic batch
//! dimension `N`, then run with a plan optimised for a concrete batch size, made on first use
//! of that size and kept (a short last batch is padded to it). tract only picks its fast
//! depthwise-convolution kernel when every dimension is known, which made EfficientNet-Lite0
//! about 20 times slower with a symbolic batch.
//!
//! With the `tract-threads` feature, a run uses the process's rayon pool of `threads` threads
//! (tract-linalg's executor splits matrix products, depthwise convolutions and element-wise
//! operators across it); without it, or with one thread, tract runs on the calling thread.

use std::sync::{Arc, Mutex};

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::DimLike;

use crate::card::{Layout, ModelCard};

type Plan = Arc<TypedRunnableModel>;

/// Plans kept per backbone; the oldest is dropped beyond this.
const MAX_PLANS: usize = 8;

/// Idle run states kept per plan: one per thread that runs the backbone at the same time
/// (training and inference), so a run allocates no per-node state.
const MAX_IDLE_STATES: usize = 2;

/// A plan for one batch size and run states made from it, reused between runs.
#[derive(Debug)]
pub(super) struct Planned {
    pub(super) batch: usize,
    plan: Plan,
    pub(super) idle: Vec<TypedSimpleState>,
}

/// A model loaded in tract, with its plans per batch size.
#[derive(Debug)]
pub(super) struct TractEngine {
    /// The model with its output selected, before the input's shape is fixed.
    model: InferenceModel,
    /// Which input the card feeds.
    input: usize,
    /// Plans made so far, by batch size, with their idle run states.
    pub(super) plans: Mutex<Vec<Planned>>,
    /// The thread pool runs go through; `None`: the calling thread.
    #[cfg(feature = "tract-threads")]
    executor: Option<tract_linalg::multithread::Executor>,
}

/// Threads tract runs on for a `threads` setting (0: one per core).
#[cfg(feature = "tract-threads")]
fn effective_threads(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    }
}

/// One rayon pool per thread count in the process, shared by every backbone that asks for it;
/// `None` for one thread. A pool whose threads cannot start is an error.
#[cfg(feature = "tract-threads")]
fn executor(threads: usize) -> Result<Option<tract_linalg::multithread::Executor>, String> {
    use tract_linalg::multithread::Executor;
    static POOLS: Mutex<Vec<(usize, Executor)>> = Mutex::new(Vec::new());
    let threads = effective_threads(threads);
    if threads <= 1 {
        return Ok(None);
    }
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, pool)) = pools.iter().find(|(n, _)| *n == threads) {
        return Ok(Some(pool.clone()));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("fedge-tract-{i}"))
        .build()
        .map_err(|e| format!("cannot start tract's {threads} threads: {e}"))?;
    let pool = Executor::MultiThread(std::sync::Arc::new(pool));
    pools.push((threads, pool.clone()));
    Ok(Some(pool))
}

fn message(e: TractError) -> String {
    format!("{e:#}")
}

fn input_shape(card: &ModelCard, batch: usize) -> [usize; 4] {
    match card.layout {
        Layout::Nchw => [batch, card.channels, card.height, card.width],
        Layout::Nhwc => [batch, card.height, card.width, card.channels],
    }
}

impl TractEngine {
    /// Loads `onnx` and checks its input and output against the card; runs will use
    /// `threads` threads (0: one per core) when built with `tract-threads`, else one.
    pub(super) fn load(
        card: &ModelCard,
        onnx: &[u8],
        #[cfg_attr(not(feature = "tract-threads"), allow(unused_variables))] threads: usize,
    ) -> Result<Self, String> {
        let mut model = tract_onnx::onnx()
            .model_for_read(&mut &onnx[..])
            .map_err(message)?;
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
            .map_err(message)?
            .iter()
            .map(|o| model.node(o.node).name.clone())
            .collect();
        let input = input_names
            .iter()
            .position(|n| *n == card.input_name)
            .ok_or_else(|| {
                format!(
                    "the card names input {:?}, the model has {:?}",
                    card.input_name, input_names
                )
            })?;
        model
            .select_outputs_by_name([&card.output_name])
            .map_err(|_| {
                format!(
                    "the card names output {:?}, which the model does not have",
                    card.output_name
                )
            })?;
        let unshaped = model.clone();
        let typed = model
            .with_input_fact(input, InferenceFact::dt_shape(f32::datum_type(), shape))
            .and_then(|m| m.into_typed())
            .map_err(message)?;
        let output = typed.output_fact(0).map_err(message)?.clone();
        // `[N, F]`, or a map per image (`[N, C, H, W]`, a cut for a trainable tail) of `F`
        // values in all, which runs return flattened.
        let features: Option<usize> = (output.shape.iter().skip(1))
            .map(|d| d.to_usize().ok())
            .product();
        if features != Some(card.feature_size) || output.rank() < 2 {
            return Err(format!(
                "the model's output has shape {:?}, the card promises [N, {}]",
                output.shape, card.feature_size
            ));
        }
        let engine = Self {
            model: unshaped,
            input,
            plans: Mutex::new(Vec::new()),
            #[cfg(feature = "tract-threads")]
            executor: executor(threads)?,
        };
        let state = engine.state(card, 1)?;
        engine.give_back(1, state);
        Ok(engine)
    }

    /// A run state of the plan for batches of exactly `batch` images: an idle one, or a new
    /// one (the plan is made and kept on first use of its size).
    fn state(&self, card: &ModelCard, batch: usize) -> Result<TypedSimpleState, String> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(planned) = plans.iter_mut().find(|p| p.batch == batch) {
            return match planned.idle.pop() {
                Some(state) => Ok(state),
                None => planned.plan.spawn().map_err(message),
            };
        }
        let shape = input_shape(card, batch);
        let plan = self
            .model
            .clone()
            .with_input_fact(
                self.input,
                InferenceFact::dt_shape(f32::datum_type(), shape),
            )
            .and_then(|m| m.into_optimized())
            .and_then(|m| m.into_runnable())
            .map_err(message)?;
        if plans.len() >= MAX_PLANS {
            plans.remove(0);
        }
        let state = plan.spawn().map_err(message)?;
        plans.push(Planned {
            batch,
            plan,
            idle: Vec::new(),
        });
        Ok(state)
    }

    /// Whether runs go through a thread pool.
    #[cfg(all(test, feature = "tract-threads"))]
    pub(super) fn threaded(&self) -> bool {
        self.executor.is_some()
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

    /// Runs one batch of `batch` normalised images; returns `batch × feature_size` values.
    pub(super) fn run(
        &self,
        card: &ModelCard,
        normalised: &[f32],
        batch: usize,
    ) -> Result<Vec<f32>, String> {
        let input = Tensor::from_shape(&input_shape(card, batch), normalised).map_err(message)?;
        let mut state = self.state(card, batch)?;
        #[cfg(feature = "tract-threads")]
        let result = match &self.executor {
            Some(pool) => tract_linalg::multithread::multithread_tract_scope(pool.clone(), || {
                state.run(tvec!(input.into()))
            }),
            None => state.run(tvec!(input.into())),
        };
        #[cfg(not(feature = "tract-threads"))]
        let result = state.run(tvec!(input.into()));
        let result = result.map_err(message)?;
        // A state whose run failed is dropped rather than reused.
        self.give_back(batch, state);
        let view = result[0].to_plain_array_view::<f32>().map_err(message)?;
        Ok(view.iter().copied().collect())
    }
}
