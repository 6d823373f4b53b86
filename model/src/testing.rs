//! What the model's property tests share.

/// A small deterministic generator (xorshift): the property runs the
/// same cases every time, and a failure names its seed.
pub struct Gen(pub u64);

impl Gen {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, min: usize, max: usize, printable: bool) -> Vec<u8> {
        let len = min + self.below((max - min + 1) as u64) as usize;
        (0..len)
            .map(|_| match printable {
                true => 0x20 + self.below(0x5f) as u8,
                false => self.next() as u8,
            })
            .collect()
    }

    pub fn number(&mut self, max: u64) -> u64 {
        // Edges as often as the middle: 1, max, and any in between.
        match self.below(3) {
            0 => 1,
            1 => max,
            _ => 1 + self.below(max),
        }
    }
}
