//! `gwrun -n N PROGRAM ARGS...`: the launcher. All logic lives in
//! [`gw_launch`] so that it can be tested; see `gwrun --help`.

fn main() {
    let args = std::env::args_os().skip(1).collect();
    std::process::exit(gw_launch::main(args));
}
