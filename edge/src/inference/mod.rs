//! Predictions on the device with the federation's released head.
//!
//! The coordinator releases the global head after every aggregation (`fedge_wire::ModelRelease`
//! on `model/current`). A device keeps the last release it verified ([`store`]), runs it over
//! its frozen backbone ([`predictor`]: images decoded and resized as training data is), and can
//! answer over HTTP ([`http`], configured by `[inference]`, [`config`]). `fedge-edge predict`
//! runs the same predictor on files.
//!
//! Modules, leaves first: [`config`], [`store`], [`variant_store`] (the variant of the release
//! the site serves), [`serving_log`] (which release the device served, from when), [`drift`], `scores` (a head's
//! logits and softmax), [`predictor`],
//! [`head_watch`] (the release served against the one it replaced), [`upload`], [`http`].

pub mod config;
pub mod drift;
pub mod head_watch;
pub mod http;
pub mod predictor;
pub(crate) mod scores;
pub mod serving_log;
pub mod store;
pub mod upload;
pub mod variant_store;

pub use config::InferenceConfig;
pub use drift::DriftWatch;
pub use head_watch::{HeadWatch, Shadow};
pub use http::{SharedPredictor, serve, serve_with};
pub use predictor::{
    ClassScore, ImageLimits, PredictError, Prediction, Predictor, PredictorError, Served,
};
pub use store::StoreError;
