//! fedge models: the trainable head, the frozen backbones and their model cards.
//!
//! - [`head`]: the head of the design (projector + classifier) as a Burn module, with the one
//!   flat parameter layout that travels on the wire.
//! - [`adversarial`]: Stable-FedADG's generator and discriminator, and the flat layout of a
//!   model that carries the generator after the head.
//! - [`backbone`]: a frozen ONNX backbone run with tract or ONNX Runtime, described by a
//!   [`ModelCard`]; [`runtime`] names the engines and ONNX Runtime's execution providers.
//! - [`bright_box`]: a tiny detector written as ONNX (the box around bright pixels), the
//!   reference of the detector contract FedDDL's masks can come from.
//! - [`generate`]: the small deterministic convolutional backbone that tests and the demo use,
//!   written as ONNX by this crate itself.
//! - [`sample`]: checks a converted backbone (EfficientNet-Lite0, see `models/tools/`) against
//!   the features its converter computed for a sample image.
//! - [`tail`]: the backbone's last convolution block, read from its ONNX file and trained with
//!   the head (the cut's activations are what the device caches then).
//! - [`device`]: which Burn backend and device (CPU, or CUDA on a Jetson) trains the head.
//!
//! This crate does no networking and knows nothing of rounds or clients.

pub mod adversarial;
pub mod backbone;
pub mod bright_box;
pub use fedge_card as card;
pub mod device;
pub mod generate;
pub mod head;
pub mod runtime;
pub mod sample;
pub mod tail;

pub use adversarial::{
    AdversarialConfig, AdversarialModules, Discriminator, Generator, ModelLayout, NOISE,
};
pub use backbone::{Backbone, BackboneError};
pub use card::{AdaptError, CardError, InvalidCard, Layout, ModelCard};
pub use device::{
    Accelerator, Backend, CUDA_BUILT, Device, SelectedDevice, select_device, training_device,
};
pub use head::{FlatLayoutError, Forward, Head, HeadConfig, HeadModules, HeadTensors};
pub use runtime::{Provider, Runtime, RuntimeConfig, RuntimeReport, TRACT_THREADS_BUILT};
pub use sample::{SampleCheck, check_sample};
pub use tail::{Tail, TailError, TailModule};
