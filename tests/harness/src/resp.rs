//! A small RESP2 client for the benches.
//!
//! Commands are encoded into one byte buffer and written as a pipeline; replies are
//! parsed straight off a buffered socket. A general-purpose client would spend more of
//! the machine's two cores on the client side, and that CPU is taken from the server
//! being measured.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Status(s) if s == "OK")
    }

    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn bulk(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }

    pub fn text(&self) -> String {
        match self {
            Reply::Status(s) | Reply::Error(s) => s.clone(),
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        }
    }

    /// `[token, fence]`, the reply of a granted `LEASE.ACQUIRE`.
    pub fn is_grant(&self) -> bool {
        match self {
            Reply::Array(Some(items)) => {
                items.len() == 2
                    && matches!(items[0], Reply::Bulk(Some(_)))
                    && matches!(items[1], Reply::Int(_))
            }
            _ => false,
        }
    }
}

/// Appends one command in RESP2 multi-bulk form.
pub fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.push(b'*');
    push_decimal(buf, args.len() as u64);
    buf.extend_from_slice(b"\r\n");
    for arg in args {
        buf.push(b'$');
        push_decimal(buf, arg.len() as u64);
        buf.extend_from_slice(b"\r\n");
        buf.extend_from_slice(arg);
        buf.extend_from_slice(b"\r\n");
    }
}

/// Writes `n` in decimal without going through `format!`.
pub fn push_decimal(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// `n` in decimal, as an argument.
pub fn decimal(n: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    push_decimal(&mut v, n);
    v
}

pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: Vec<u8>,
}

impl Conn {
    pub fn connect(port: u16) -> io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        // Generous: a FLUSHALL of a million keys or a large pipeline takes seconds.
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let writer = stream.try_clone()?;
        Ok(Conn {
            reader: BufReader::with_capacity(1 << 16, stream),
            writer,
            line: Vec::with_capacity(64),
        })
    }

    /// Writes already encoded commands.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// Reads one reply.
    pub fn read(&mut self) -> io::Result<Reply> {
        self.line.clear();
        let n = self.reader.read_until(b'\n', &mut self.line)?;
        if n < 3 || !self.line.ends_with(b"\r\n") {
            return Err(bad(format!(
                "truncated reply line {:?}",
                String::from_utf8_lossy(&self.line)
            )));
        }
        let kind = self.line[0];
        let body = std::str::from_utf8(&self.line[1..n - 2])
            .map_err(|_| bad("reply line is not UTF-8".to_string()))?
            .to_string();
        let number = || {
            body.parse::<i64>()
                .map_err(|_| bad(format!("bad number in reply: {body:?}")))
        };
        match kind {
            b'+' => Ok(Reply::Status(body)),
            b'-' => Ok(Reply::Error(body)),
            b':' => Ok(Reply::Int(number()?)),
            b'$' => {
                let len = number()?;
                if len < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let mut data = vec![0u8; len as usize + 2];
                self.reader.read_exact(&mut data)?;
                data.truncate(len as usize);
                Ok(Reply::Bulk(Some(data)))
            }
            b'*' => {
                let len = number()?;
                if len < 0 {
                    return Ok(Reply::Array(None));
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.read()?);
                }
                Ok(Reply::Array(Some(items)))
            }
            other => Err(bad(format!("unknown reply type byte {other:#x}"))),
        }
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut buf = Vec::with_capacity(64);
        encode(&mut buf, args);
        self.send(&buf)?;
        self.read()
    }

    /// `call` for set-up commands: any failure ends the bench with the command named.
    pub fn must(&mut self, args: &[&str]) -> Reply {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        match self.call(&bytes) {
            Ok(Reply::Error(e)) => panic!("{} failed: {e}", args.join(" ")),
            Ok(reply) => reply,
            Err(e) => panic!("{} failed: {e}", args.join(" ")),
        }
    }
}

fn bad(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}
