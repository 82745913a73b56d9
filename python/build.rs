//! Sets `LADLE_COMMIT` and `LADLE_FEATURES` for `ladle.build_info()` and `python -m ladle --version` (`ladle-build-info`).

fn main() {
    ladle_build_info::emit();
}
