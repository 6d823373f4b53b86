//! Module values as Redis serializes them (`RDB_TYPE_MODULE_2`, in an RDB
//! file, a `DUMP` payload or a full sync), read the way Redis's
//! `RedisModule_LoadUnsigned` / `RedisModule_LoadStringBuffer` read them, so
//! the fuzz targets reach `encoding.rs` with what a hostile payload can
//! really deliver.
//!
//! Each value is an opcode (itself an RDB length: 2 = unsigned, 5 = string)
//! and then the value:
//! - an unsigned is an RDB length: `00xxxxxx` (6 bits), `01xxxxxx xxxxxxxx`
//!   (14 bits), `0x80` + 4 bytes or `0x81` + 8 bytes (big endian); `11xxxxxx`
//!   also reads as its low 6 bits, as `rdbLoadLen` does; `0x82..=0xBF` is
//!   broken;
//! - a string is an RDB length and that many bytes, or an encoded string:
//!   `0xC0`/`0xC1`/`0xC2` an 8/16/32-bit little-endian integer (its decimal
//!   text), `0xC3` LZF (compressed length, length, data).
//!
//! Anything else, or too few bytes, is a short read (`None`), as an IO error
//! is for a module that handles them. A string longer than what is left is
//! refused without allocating it.
//!
//! The writing side is `crate::rdb` (model/src/rdb.rs), the encoder the
//! integration tests craft payloads with.

use crate::rdb::{OPCODE_STRING, OPCODE_UINT};

/// An RDB length as `rdbLoadLenByRef` reads it: the value and whether it was
/// the "encoded" form (`11xxxxxx`).
fn load_len(input: &mut &[u8]) -> Option<(u64, bool)> {
    let (&first, rest) = input.split_first()?;
    *input = rest;
    let take = |input: &mut &[u8], n: usize| -> Option<u64> {
        if input.len() < n {
            return None;
        }
        let (bytes, rest) = input.split_at(n);
        *input = rest;
        Some(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    };
    match first >> 6 {
        0 => Some((u64::from(first & 0x3f), false)),
        1 => Some(((u64::from(first & 0x3f) << 8) | take(input, 1)?, false)),
        3 => Some((u64::from(first & 0x3f), true)),
        _ => match first {
            0x80 => Some((take(input, 4)?, false)),
            0x81 => Some((take(input, 8)?, false)),
            _ => None,
        },
    }
}

/// liblzf's `lzf_decompress`, into exactly `len` bytes (Redis refuses any
/// other outcome, and an empty result).
fn lzf_decompress(input: &[u8], len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    let mut ip = 0;
    while ip < input.len() {
        let ctrl = usize::from(input[ip]);
        ip += 1;
        if ctrl < 32 {
            let run = ctrl + 1;
            let literal = input.get(ip..ip + run)?;
            if out.len() + run > len {
                return None;
            }
            out.extend_from_slice(literal);
            ip += run;
        } else {
            let mut run = ctrl >> 5;
            let mut back = (ctrl & 0x1f) << 8;
            if run == 7 {
                run += usize::from(*input.get(ip)?);
                ip += 1;
            }
            back += usize::from(*input.get(ip)?);
            ip += 1;
            run += 2;
            if out.len() + run > len || back + 1 > out.len() {
                return None;
            }
            let start = out.len() - back - 1;
            for i in 0..run {
                let b = out[start + i];
                out.push(b);
            }
        }
    }
    (out.len() == len && len > 0).then_some(out)
}

/// A reader over one serialized module value.
pub struct Reader<'a> {
    input: &'a [u8],
    /// Set on the first short read: every later read fails too, as with
    /// Redis's `io->error`.
    failed: bool,
}

impl<'a> Reader<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        Self {
            input,
            failed: false,
        }
    }

    fn opcode(&mut self, expected: u64) -> Option<()> {
        let (opcode, _) = load_len(&mut self.input)?;
        (opcode == expected).then_some(())
    }

    fn read_unsigned(&mut self) -> Option<u64> {
        self.opcode(OPCODE_UINT)?;
        load_len(&mut self.input).map(|(v, _)| v)
    }

    fn read_buffer(&mut self) -> Option<Box<[u8]>> {
        self.opcode(OPCODE_STRING)?;
        let (len, encoded) = load_len(&mut self.input)?;
        if !encoded {
            let len = usize::try_from(len)
                .ok()
                .filter(|&n| n <= self.input.len())?;
            let (bytes, rest) = self.input.split_at(len);
            self.input = rest;
            return Some(bytes.into());
        }
        let int = |input: &mut &[u8], n: usize| -> Option<i64> {
            if input.len() < n {
                return None;
            }
            let (bytes, rest) = input.split_at(n);
            *input = rest;
            let mut le = [0u8; 8];
            le[..n].copy_from_slice(bytes);
            let shift = 64 - 8 * n as u32;
            Some((i64::from_le_bytes(le) << shift) >> shift)
        };
        match len {
            0 => int(&mut self.input, 1).map(|v| v.to_string().into_bytes().into()),
            1 => int(&mut self.input, 2).map(|v| v.to_string().into_bytes().into()),
            2 => int(&mut self.input, 4).map(|v| v.to_string().into_bytes().into()),
            3 => {
                let (clen, _) = load_len(&mut self.input)?;
                let (len, _) = load_len(&mut self.input)?;
                let clen = usize::try_from(clen)
                    .ok()
                    .filter(|&n| n <= self.input.len())?;
                // One LZF input byte yields at most 264 / 2 bytes: a longer
                // promised length cannot come out exactly.
                let len = usize::try_from(len).ok().filter(|&n| n <= clen * 132)?;
                let (compressed, rest) = self.input.split_at(clen);
                self.input = rest;
                lzf_decompress(compressed, len).map(Vec::into_boxed_slice)
            }
            _ => None,
        }
    }

    /// The next unsigned, or `None` (and every read after it) on a short read.
    pub fn next_unsigned(&mut self) -> Option<u64> {
        if self.failed {
            return None;
        }
        let v = self.read_unsigned();
        self.failed = v.is_none();
        v
    }

    pub fn next_buffer(&mut self) -> Option<Box<[u8]>> {
        if self.failed {
            return None;
        }
        let v = self.read_buffer();
        self.failed = v.is_none();
        v
    }

    /// What is left after the values read so far.
    pub fn rest(&self) -> &'a [u8] {
        self.input
    }
}

impl crate::encoding::Reader for Reader<'_> {
    fn unsigned(&mut self) -> Option<u64> {
        self.next_unsigned()
    }

    fn buffer(&mut self) -> Option<Box<[u8]>> {
        self.next_buffer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdb::push_len;

    #[test]
    fn lengths_round_trip_in_every_form() {
        for v in [
            0,
            63,
            64,
            16383,
            16384,
            u64::from(u32::MAX),
            1 << 32,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            push_len(&mut out, v);
            let mut input = &out[..];
            assert_eq!(load_len(&mut input), Some((v, false)), "{v}");
            assert!(input.is_empty());
        }
        assert_eq!(load_len(&mut &[0xc5][..]), Some((5, true)));
        assert_eq!(load_len(&mut &[0x82, 0, 0, 0, 0][..]), None);
        assert_eq!(load_len(&mut &[0x80, 0, 0][..]), None);
    }

    #[test]
    fn strings_plain_integer_and_lzf() {
        assert_eq!(
            Reader::new(&[5, 3, b'a', b'b', b'c'])
                .next_buffer()
                .as_deref(),
            Some(&b"abc"[..])
        );
        assert_eq!(Reader::new(&[5, 4, b'a', b'b', b'c']).next_buffer(), None);
        assert_eq!(
            Reader::new(&[5, 0xc0, 0xff]).next_buffer().as_deref(),
            Some(&b"-1"[..])
        );
        assert_eq!(
            Reader::new(&[5, 0xc1, 0x39, 0x30]).next_buffer().as_deref(),
            Some(&b"12345"[..])
        );
        // "aaaaaaaaaa": a literal run of one 'a', then a back reference at
        // distance 1 of 7 + 0 (extension byte) + 2 = 9 bytes.
        let lzf = [5, 0xc3, 5, 10, 0x00, b'a', 0xe0, 0x00, 0x00];
        assert_eq!(
            Reader::new(&lzf).next_buffer().as_deref(),
            Some(&b"aaaaaaaaaa"[..])
        );
        // A huge promised length is refused without allocating it.
        let mut huge = vec![5, 0x81];
        huge.extend_from_slice(&(1u64 << 63).to_be_bytes());
        assert_eq!(Reader::new(&huge).next_buffer(), None);
    }

    #[test]
    fn a_short_read_fails_every_later_read() {
        let mut r = Reader::new(&[5, 0, 2, 7]);
        assert_eq!(r.next_unsigned(), None);
        assert_eq!(r.next_unsigned(), None);
    }

    #[test]
    fn the_seed_corpora_pass_their_targets() {
        for (target, run) in [
            ("args", crate::fuzz_args as fn(&[u8])),
            ("decode", crate::fuzz_decode),
            ("effect", crate::fuzz_effect),
            ("replica", crate::fuzz_replica),
        ] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("corpus")
                .join(target);
            let entries = std::fs::read_dir(&dir).expect("corpus dir");
            let mut n = 0;
            for entry in entries {
                let data = std::fs::read(entry.expect("entry").path()).expect("seed");
                run(&data);
                n += 1;
            }
            assert!(n >= 5, "{target}: {n} seeds");
        }
    }
}
