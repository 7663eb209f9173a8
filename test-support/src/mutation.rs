//! Seeded byte mutations of text lines, for the tests that run a fast reader and the general
//! one over many damaged inputs: one generator and one mutator, so a failure names a
//! reproducible input whichever suite found it.

/// Most bytes a repeated stretch copies (duplicate keys, members, array items).
const MAX_STRETCH_BYTES: usize = 32;

/// A small deterministic generator (xorshift64*).
pub struct Draws(u64);

impl Draws {
    /// A stream of draws from `seed` (not 0: xorshift would stay at 0).
    pub fn new(seed: u64) -> Draws {
        assert_ne!(seed, 0, "xorshift needs a non-zero seed");
        Draws(seed)
    }

    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A draw in `0..bound` (`0` when `bound` is 0).
    pub fn below(&mut self, bound: usize) -> usize {
        let bound = u64::try_from(bound.max(1)).expect("a usize fits a u64");
        usize::try_from(self.draw() % bound).expect("below a usize bound")
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// One or two edits of `line`: delete a byte, insert or overwrite one with a byte of
/// `alphabet`, bump a digit (or insert a space where there is none), or repeat a stretch of
/// up to [`MAX_STRETCH_BYTES`].
pub fn mutated(line: &[u8], alphabet: &[u8], draws: &mut Draws) -> Vec<u8> {
    let mut bytes = line.to_vec();
    for _ in 0..1 + draws.below(2) {
        if bytes.is_empty() {
            bytes.push(draws.pick(alphabet));
            continue;
        }
        let at = draws.below(bytes.len());
        let byte = draws.pick(alphabet);
        match draws.below(5) {
            0 => {
                bytes.remove(at);
            }
            1 => bytes.insert(at, byte),
            2 => bytes[at] = byte,
            3 if bytes[at].is_ascii_digit() => bytes[at] = b'0' + (bytes[at] - b'0' + 1) % 10,
            3 => bytes.insert(at, b' '),
            _ => {
                let end = (at + 1 + draws.below(MAX_STRETCH_BYTES)).min(bytes.len());
                let stretch = bytes[at..end].to_vec();
                bytes.splice(at..at, stretch);
            }
        }
    }
    bytes
}
