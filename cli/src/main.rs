//! The `ladle` binary: the command line of `ladle_cli` (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    ladle_cli::run(std::env::args_os())
}
