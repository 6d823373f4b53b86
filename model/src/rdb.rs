//! Module values as Redis serializes them, written byte by byte: the one encoder the
//! integration tests (crafted `RESTORE` payloads and RDB files) and the fuzz targets
//! build their inputs with. The module itself never writes these bytes (Redis does,
//! from `rdb_save`); this is the reader's counterpart for those who craft inputs.
//!
//! A `DUMP` payload is `<value> <RDB version: 2 bytes LE> <CRC-64 of both: 8 bytes LE>`.
//! A module value is the type byte 7 (`RDB_TYPE_MODULE_2`), the module id as an RDB
//! length (`0x81` + 8 bytes big endian: the 9-character type name, 6 bits a character,
//! then 10 bits of encoding version), each saved field behind an opcode (2 = unsigned,
//! 5 = string), then opcode 0 (EOF). An RDB length is `00xxxxxx` (6 bits),
//! `01xxxxxx xxxxxxxx` (14 bits), or `0x80` + 4 / `0x81` + 8 bytes big endian.

/// `RDB_TYPE_MODULE_2`: the type byte of a module value.
pub const RDB_TYPE_MODULE_2: u8 = 7;
/// `RDB_MODULE_OPCODE_EOF`
pub const OPCODE_EOF: u64 = 0;
/// `RDB_MODULE_OPCODE_UINT`
pub const OPCODE_UINT: u64 = 2;
/// `RDB_MODULE_OPCODE_STRING`
pub const OPCODE_STRING: u64 = 5;

/// The characters of a module type name, in the order of their 6-bit codes.
const TYPE_NAME_CHARSET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// An RDB length as `rdbSaveLen` writes it.
pub fn push_len(out: &mut Vec<u8>, v: u64) {
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.push(0x40 | (v >> 8) as u8);
        out.push(v as u8);
    } else if v <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// `RedisModule_SaveUnsigned`: the opcode, then the value as an RDB length.
pub fn push_unsigned(out: &mut Vec<u8>, v: u64) {
    push_len(out, OPCODE_UINT);
    push_len(out, v);
}

/// `RedisModule_SaveStringBuffer`: the opcode, the length, the bytes.
pub fn push_buffer(out: &mut Vec<u8>, b: &[u8]) {
    push_len(out, OPCODE_STRING);
    push_len(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// One unsigned field: a fence-rec value or the fence sequence, as the module saves it.
pub fn encode_unsigned(v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    push_unsigned(&mut out, v);
    out
}

/// The fields of a lease-key value as the module saves it (encoding 1): fence,
/// deadline, token.
pub fn encode_lease(fence: u64, deadline_ms: u64, token: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_unsigned(&mut out, fence);
    push_unsigned(&mut out, deadline_ms);
    push_buffer(&mut out, token);
    out
}

/// The module type id Redis derives from a 9-character type name and an encoding version.
pub fn module_id(name: &str, encver: u64) -> u64 {
    assert_eq!(
        name.len(),
        9,
        "a module type name has 9 characters: {name:?}"
    );
    let id = name.bytes().fold(0u64, |id, c| {
        let index = TYPE_NAME_CHARSET
            .iter()
            .position(|&x| x == c)
            .unwrap_or_else(|| panic!("{c:?} is not a type name character"))
            as u64;
        (id << 6) | index
    });
    (id << 10) | (encver & 1023)
}

/// CRC-64 as Redis computes it for DUMP payloads and RDB files: Jones polynomial,
/// reflected, init 0, no final xor.
pub fn crc64(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 bit-reversed
    let mut crc = 0u64;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A DUMP payload: `body` + the RDB version + a valid CRC-64 of both.
pub fn seal(body: &[u8], version: [u8; 2]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(&version);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A module value (the body of a DUMP payload), built field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body(pub Vec<u8>);

impl Body {
    /// The type byte and the module id of `type_name` at encoding version `encver`.
    pub fn new(type_name: &str, encver: u64) -> Body {
        Body::with_id(module_id(type_name, encver))
    }

    /// The type byte and module id `id`.
    pub fn with_id(id: u64) -> Body {
        let mut b = vec![RDB_TYPE_MODULE_2, 0x81];
        b.extend_from_slice(&id.to_be_bytes());
        Body(b)
    }

    pub fn unsigned(mut self, v: u64) -> Body {
        push_unsigned(&mut self.0, v);
        self
    }

    pub fn string(mut self, s: &[u8]) -> Body {
        push_buffer(&mut self.0, s);
        self
    }

    /// A string opcode and a length with fewer bytes behind it than it promises.
    pub fn string_len_only(mut self, len: u64) -> Body {
        push_len(&mut self.0, OPCODE_STRING);
        push_len(&mut self.0, len);
        self
    }

    pub fn raw(mut self, bytes: &[u8]) -> Body {
        self.0.extend_from_slice(bytes);
        self
    }

    pub fn eof(mut self) -> Body {
        push_len(&mut self.0, OPCODE_EOF);
        self
    }

    /// A compact lease-key value (encoding 3, as 2) as the module saves it.
    pub fn lease(fence: u64, deadline: u64, token: &[u8]) -> Body {
        Body::new("lease-key", 3).lease_fields(fence, deadline, token)
    }

    /// A fence-rec value (encoding 3, the same as 1) as the module saves it.
    pub fn record(highest: u64) -> Body {
        Body::new("fence-rec", 3).unsigned(highest).eof()
    }

    /// After the module id: fence, deadline, token, (encoding 2: the compact marker,)
    /// EOF.
    pub fn lease_fields(self, fence: u64, deadline: u64, token: &[u8]) -> Body {
        let encver = self.module_id() & 1023;
        let body = self.raw(&encode_lease(fence, deadline, token));
        // Encodings 2 and 3 mark a compact lease (version 1's fields and nothing
        // more).
        let body = if encver >= 2 { body.unsigned(0) } else { body };
        body.eof()
    }

    /// The first `len` bytes.
    pub fn cut(&self, len: usize) -> Body {
        Body(self.0[..len].to_vec())
    }

    /// The module id after the type byte.
    pub fn module_id(&self) -> u64 {
        assert_eq!(
            &self.0[..2],
            &[RDB_TYPE_MODULE_2, 0x81],
            "a module value: {:?}",
            self.0
        );
        let mut id = [0u8; 8];
        id.copy_from_slice(&self.0[2..10]);
        u64::from_be_bytes(id)
    }
}
