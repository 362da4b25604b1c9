// Cargo unifies build dependencies' features only for a package with a build script.
fn main() {}
