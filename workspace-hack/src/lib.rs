//! No code: this crate exists for its manifest, which names, for each third-party crate the
//! workspace builds with more than one feature set, the union of those features (written by
//! `workspace-hack/generate.sh` with cargo-hakari). Every member depends on it, so every build
//! of the workspace resolves one feature set and shares one build of burn and tract.
