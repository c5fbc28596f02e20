//! gwtrain: trains an MLP data-parallel, one rank per process.
fn main() {
    eprintln!("gwtrain: not built yet");
    std::process::exit(1);
}
