//! `gwjob`: the job server, node agent and client in one binary.
fn main() {
    eprintln!("gwjob: not built yet");
    std::process::exit(2);
}
