//! Deterministic random bytes for the GPU checks (a test and the `cuda_check` example).

/// `n` bytes from a small deterministic generator (xorshift64*), so failures reproduce.
pub(crate) fn random_bytes(n: usize, mut state: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}
