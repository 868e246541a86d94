//! Seeded randomness for the simulator.
//!
//! One master seed (`u64`) derives every random stream of a run. Each consumer (the
//! network, the operator, the fault injector, each node's boot seeds) gets its own stream,
//! derived by hashing the master seed with a fixed label, so adding a draw to one consumer
//! never shifts the numbers another consumer sees. Only integer arithmetic is used (no
//! floating point), so a seed replays to the same run on every platform.

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

/// A deterministic random stream.
pub struct SimRng(ChaCha20Rng);

impl SimRng {
    /// The stream named `label` of the run with master seed `master`.
    pub fn derive(master: u64, label: &str) -> SimRng {
        let mut h = Sha256::new();
        h.update(b"cairn-sim/v1/");
        h.update(master.to_le_bytes());
        h.update(b"/");
        h.update(label.as_bytes());
        let seed: [u8; 32] = h.finalize().into();
        SimRng(ChaCha20Rng::from_seed(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// 32 fresh bytes (a node's RNG seed).
    pub fn seed32(&mut self) -> [u8; 32] {
        let mut s = [0u8; 32];
        self.0.fill_bytes(&mut s);
        s
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.0.fill_bytes(&mut v);
        v
    }

    /// Uniform in `0..n` (`n` > 0). Multiply-shift; the bias is far below anything a
    /// simulation can notice.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "SimRng::below(0)");
        ((self.0.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "SimRng::range({lo}, {hi})");
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `permille / 1000`.
    pub fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }

    /// A delay with the given mean: uniform in `0..=2*mean`, with a rare long tail
    /// (one draw in 16 is up to eight times the mean).
    pub fn delay(&mut self, mean: u64) -> u64 {
        if self.below(16) == 0 {
            self.range(0, mean.saturating_mul(8))
        } else {
            self.range(0, mean.saturating_mul(2))
        }
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> Option<&'a T> {
        if xs.is_empty() {
            None
        } else {
            xs.get(self.below(xs.len() as u64) as usize)
        }
    }

    /// Index chosen with the given integer weights (at least one weight non-zero).
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        assert!(total > 0, "SimRng::weighted: all weights are zero");
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }
}

/// SplitMix64: the sequence of seeds `--seeds K` runs after its starting seed.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_stable_and_independent() {
        let mut a = SimRng::derive(7, "net");
        let mut b = SimRng::derive(7, "net");
        let mut c = SimRng::derive(7, "operator");
        let xa: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut r = SimRng::derive(1, "t");
        for _ in 0..1000 {
            let x = r.range(3, 9);
            assert!((3..=9).contains(&x));
            assert!(r.weighted(&[0, 5, 0]) == 1);
        }
    }
}
