//! gwrun (being written)
fn main() {}
