//! A `MIGRATE` that carries session groups whole: which of its arguments
//! name keys (read as the server reads them), the keys that must go with
//! them, and the argument edits that make the one MIGRATE carry them all.
//!
//! A session and the holds bound to it are one group: the session ends on
//! the source when its key leaves (and the holds still there are freed), and
//! bound keys that arrive before their session are free on the target. A
//! MIGRATE that moves a group in parts (`redis-cli --cluster reshard` moves
//! a slot in batches) breaks the session invariant either way; one MIGRATE
//! that carries the group, its session first, does not.

use std::collections::{HashSet, VecDeque};

/// Where a MIGRATE names its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyList {
    /// `MIGRATE host port key db timeout [options]`: argument 3.
    Single,
    /// `MIGRATE host port "" db timeout [options] KEYS key ...`: every
    /// argument from `first` on.
    Keys { first: usize },
}

/// Argument 3, the single form's key (empty in the KEYS form).
const KEY_ARG: usize = 3;
/// The first option, after `MIGRATE host port key db timeout`.
const FIRST_OPTION: usize = 6;

/// Reads a MIGRATE's arguments (the command's name first) as the server's
/// `migrateCommand` does; `None` for one it refuses, which moves nothing.
pub fn key_list(args: &[&[u8]]) -> Option<KeyList> {
    if args.len() < FIRST_OPTION {
        return None;
    }
    let mut at = FIRST_OPTION;
    while let Some(word) = args.get(at) {
        let more = args.len() - 1 - at;
        if word.eq_ignore_ascii_case(b"COPY") || word.eq_ignore_ascii_case(b"REPLACE") {
            at += 1;
        } else if word.eq_ignore_ascii_case(b"AUTH") && more >= 1 {
            at += 2;
        } else if word.eq_ignore_ascii_case(b"AUTH2") && more >= 2 {
            at += 3;
        } else if word.eq_ignore_ascii_case(b"KEYS") {
            // Everything after KEYS is a key; the server refuses the form
            // with a key in argument 3.
            return args
                .get(KEY_ARG)
                .is_some_and(|k| k.is_empty())
                .then_some(KeyList::Keys { first: at + 1 });
        } else {
            return None;
        }
    }
    Some(KeyList::Single)
}

/// What this node knows of one key's session groups.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Related {
    /// When the key holds a session grant with holds bound to it: the keys
    /// of those holds.
    pub bound: Vec<Box<[u8]>>,
    /// The session keys on this node (holding the very grant) that the
    /// key's own holds are bound to.
    pub sessions: Vec<Box<[u8]>>,
}

/// Asks the node about keys.
pub trait Groups {
    fn related(&mut self, key: &[u8]) -> Related;
}

/// The key list closed over session groups: for every key listed or
/// added, its session's whole group, until nothing is added. Each session
/// with a group goes first (bound keys that arrive before their session
/// are free on the target until it comes, and its reaper may take them in
/// between), then the listed keys in their order, then the added ones; no
/// key twice but as the caller listed it. So the list only grows. On a cluster (`cluster`) only
/// keys of the slot of the key that named them are added: one MIGRATE
/// carries one slot, and a group is one slot but for a value restored
/// under a name of another.
///
/// `None` when the list is that already.
pub fn close(listed: &[&[u8]], groups: &mut impl Groups, cluster: bool) -> Option<Vec<Box<[u8]>>> {
    let mut seen: HashSet<Box<[u8]>> = HashSet::with_capacity(listed.len());
    let mut queue: VecDeque<Box<[u8]>> = VecDeque::with_capacity(listed.len());
    for key in listed {
        if seen.insert(Box::from(*key)) {
            queue.push_back(Box::from(*key));
        }
    }
    let mut heads: Vec<Box<[u8]>> = Vec::new();
    let mut added: Vec<Box<[u8]>> = Vec::new();
    while let Some(key) = queue.pop_front() {
        let related = groups.related(&key);
        let slot = cluster.then(|| key_slot(&key));
        if !related.bound.is_empty() {
            heads.push(key);
        }
        for other in related.bound.into_iter().chain(related.sessions) {
            if slot.is_some_and(|s| key_slot(&other) != s) || seen.contains(&other) {
                continue;
            }
            seen.insert(other.clone());
            added.push(other.clone());
            queue.push_back(other);
        }
    }
    if added.is_empty()
        && heads
            .iter()
            .enumerate()
            .all(|(i, h)| listed.get(i) == Some(&&**h))
    {
        return None;
    }
    // Each session moved ahead leaves the list once; a name the caller
    // listed twice stays twice (the server refuses that as it would have).
    let mut to_skip: HashSet<&[u8]> = heads.iter().map(|k| &**k).collect();
    let mut keys: Vec<Box<[u8]>> = Vec::with_capacity(listed.len() + added.len());
    keys.extend(heads.iter().cloned());
    keys.extend(
        listed
            .iter()
            .filter(|k| !to_skip.remove(**k))
            .map(|k| Box::from(*k)),
    );
    let is_head: HashSet<&[u8]> = heads.iter().map(|k| &**k).collect();
    keys.extend(added.into_iter().filter(|k| !is_head.contains(&**k)));
    Some(keys)
}

/// One change to a filtered command's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// The argument at this position becomes these bytes.
    Replace(usize, Box<[u8]>),
    /// These bytes go after the last argument.
    Append(Box<[u8]>),
}

/// The edits that make a MIGRATE (`args`, its name first) carry the whole
/// session group of every key it names; none for one that does already, or
/// that the server refuses anyway. The single form becomes the KEYS form
/// (its key argument `""`, then `KEYS` and the list), which only it may be
/// once it names more than one key; the KEYS form has its list rewritten
/// in place and extended (KEYS is always its last option).
pub fn plan(args: &[&[u8]], groups: &mut impl Groups, cluster: bool) -> Vec<Edit> {
    let Some(form) = key_list(args) else {
        return Vec::new();
    };
    let listed: &[&[u8]] = match form {
        KeyList::Single => args.get(KEY_ARG..KEY_ARG + 1).unwrap_or_default(),
        KeyList::Keys { first } => args.get(first..).unwrap_or_default(),
    };
    let Some(keys) = close(listed, groups, cluster) else {
        return Vec::new();
    };
    match form {
        KeyList::Single => {
            let mut edits = vec![
                Edit::Replace(KEY_ARG, Box::default()),
                Edit::Append(Box::from(&b"KEYS"[..])),
            ];
            edits.extend(keys.into_iter().map(Edit::Append));
            edits
        }
        KeyList::Keys { first } => keys
            .into_iter()
            .enumerate()
            .filter_map(|(i, key)| match listed.get(i) {
                Some(was) if **was == *key => None,
                Some(_) => Some(Edit::Replace(first + i, key)),
                None => Some(Edit::Append(key)),
            })
            .collect(),
    }
}

/// The cluster hash slot of a key, as the server computes it: CRC16
/// (XMODEM) of the key, or of the part between its first `{` and the next
/// `}` when that part is not empty, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let len = rest.iter().position(|&b| b == b'}')?;
        rest.get(..len).filter(|tag| !tag.is_empty())
    });
    crc16_xmodem(tagged.unwrap_or(key)) & 0x3fff
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn args(words: &[&'static str]) -> Vec<&'static [u8]> {
        words.iter().map(|w| w.as_bytes()).collect()
    }

    #[test]
    fn key_lists_are_read_as_the_server_reads_them() {
        let base = ["MIGRATE", "h", "1", "k", "0", "10"];
        let keys = ["MIGRATE", "h", "1", "", "0", "10"];
        let with = |head: &[&'static str], tail: &[&'static str]| {
            let mut all = head.to_vec();
            all.extend_from_slice(tail);
            all
        };
        let cases: Vec<(Vec<&str>, Option<KeyList>)> = vec![
            (base.to_vec(), Some(KeyList::Single)),
            (with(&base, &["copy", "REPLACE"]), Some(KeyList::Single)),
            (with(&base, &["AUTH", "pw"]), Some(KeyList::Single)),
            (with(&base, &["AUTH2", "u", "pw"]), Some(KeyList::Single)),
            // The password is not an option, even when it reads like one.
            (with(&base, &["AUTH", "KEYS"]), Some(KeyList::Single)),
            (
                with(&keys, &["AUTH", "KEYS", "KEYS", "a"]),
                Some(KeyList::Keys { first: 9 }),
            ),
            (
                with(&keys, &["KEYS", "a", "b"]),
                Some(KeyList::Keys { first: 7 }),
            ),
            (
                with(&keys, &["COPY", "keys", "a"]),
                Some(KeyList::Keys { first: 8 }),
            ),
            // Every argument after KEYS is a key, options' names too.
            (
                with(&keys, &["KEYS", "a", "COPY"]),
                Some(KeyList::Keys { first: 7 }),
            ),
            (with(&keys, &["KEYS"]), Some(KeyList::Keys { first: 7 })),
            // Refused by the server: nothing to plan.
            (with(&base, &["KEYS", "a"]), None),
            (with(&base, &["AUTH"]), None),
            (with(&base, &["AUTH2", "u"]), None),
            (with(&base, &["NOSUCH"]), None),
            (base[..5].to_vec(), None),
        ];
        for (words, want) in cases {
            assert_eq!(key_list(&args(&words)), want, "{words:?}");
        }
    }

    /// A node: each session with its bound keys, and each bound key with
    /// the sessions it is bound to.
    #[derive(Default)]
    struct Node {
        groups: HashMap<&'static str, Vec<&'static str>>,
        asked: Vec<String>,
    }

    impl Node {
        fn with(groups: &[(&'static str, &[&'static str])]) -> Self {
            Node {
                groups: groups.iter().map(|(s, ks)| (*s, ks.to_vec())).collect(),
                asked: Vec::new(),
            }
        }
    }

    impl Groups for Node {
        fn related(&mut self, key: &[u8]) -> Related {
            let key = std::str::from_utf8(key).unwrap_or_default();
            self.asked.push(key.to_string());
            let boxed = |k: &str| Box::from(k.as_bytes());
            let mut sessions: Vec<&str> = self
                .groups
                .iter()
                .filter(|(_, keys)| keys.contains(&key))
                .map(|(s, _)| *s)
                .collect();
            sessions.sort_unstable();
            Related {
                bound: self
                    .groups
                    .get(key)
                    .map_or(Vec::new(), |keys| keys.iter().map(|k| boxed(k)).collect()),
                sessions: sessions.into_iter().map(boxed).collect(),
            }
        }
    }

    fn planned(node: &mut Node, words: &[&'static str], cluster: bool) -> Vec<String> {
        plan(&args(words), node, cluster)
            .into_iter()
            .map(|e| match e {
                Edit::Replace(at, b) => format!("{at}={}", String::from_utf8_lossy(&b)),
                Edit::Append(b) => format!("+{}", String::from_utf8_lossy(&b)),
            })
            .collect()
    }

    const KEYS: [&str; 7] = ["MIGRATE", "h", "1", "", "0", "10", "KEYS"];
    const SINGLE: [&str; 3] = ["MIGRATE", "h", "1"];

    fn keys_form(tail: &[&'static str]) -> Vec<&'static str> {
        let mut all = KEYS.to_vec();
        all.extend_from_slice(tail);
        all
    }

    fn single_form(key: &'static str, tail: &[&'static str]) -> Vec<&'static str> {
        let mut all = SINGLE.to_vec();
        all.extend_from_slice(&[key, "0", "10"]);
        all.extend_from_slice(tail);
        all
    }

    #[test]
    fn a_migrate_takes_each_group_whole_its_session_first() {
        let groups: &[(&str, &[&str])] =
            &[("s", &["a", "b", "c"]), ("t", &["c", "d"]), ("u", &["e"])];
        let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
            // Nothing of a group: nothing to do.
            (keys_form(&["x", "y"]), vec![]),
            (single_form("x", &[]), vec![]),
            // Closed and in order already.
            (keys_form(&["s", "t", "a", "b", "c", "d"]), vec![]),
            // Closed, but a session after keys of its group.
            (
                keys_form(&["s", "a", "b", "c", "t", "d"]),
                vec!["8=t", "9=a", "10=b", "11=c"],
            ),
            (keys_form(&["u", "e", "x"]), vec![]),
            // A session takes its keys, and through a shared key the other
            // session and its keys.
            (keys_form(&["s"]), vec!["+t", "+a", "+b", "+c", "+d"]),
            // A bound key takes its session (first) and the rest.
            (keys_form(&["x", "e"]), vec!["7=u", "8=x", "+e"]),
            // A batch without the session, then one with it.
            (
                keys_form(&["a", "b"]),
                vec!["7=s", "8=t", "+a", "+b", "+c", "+d"],
            ),
            // Listed in the wrong order: the sessions go first.
            (keys_form(&["e", "u"]), vec!["7=u", "8=e"]),
            // The single form becomes the KEYS form, options kept.
            (
                single_form("e", &["COPY", "AUTH", "pw"]),
                vec!["3=", "+KEYS", "+u", "+e"],
            ),
            (single_form("u", &[]), vec!["3=", "+KEYS", "+u", "+e"]),
            // A key listed twice stays twice; a session is moved, once.
            (keys_form(&["x", "x", "e"]), vec!["7=u", "9=x", "+e"]),
            (keys_form(&["e", "u", "u"]), vec!["7=u", "8=e"]),
            // Refused by the server anyway.
            (single_form("e", &["KEYS", "a"]), vec![]),
        ];
        for (words, want) in cases {
            let mut node = Node::with(groups);
            assert_eq!(planned(&mut node, &words, false), want, "{words:?}");
        }
    }

    #[test]
    fn each_key_is_asked_about_once() {
        let groups: &[(&str, &[&str])] = &[("s", &["a", "b"]), ("t", &["b", "a"])];
        let mut node = Node::with(groups);
        planned(&mut node, &keys_form(&["a", "a", "b"]), false);
        node.asked.sort();
        assert_eq!(node.asked, ["a", "b", "s", "t"]);
    }

    #[test]
    fn on_a_cluster_a_group_stays_in_its_slot() {
        let groups: &[(&str, &[&str])] = &[("{w}s", &["{w}a", "{x}stray", "{w}b"])];
        let mut node = Node::with(groups);
        assert_eq!(
            planned(&mut node, &keys_form(&["{w}s"]), true),
            ["+{w}a", "+{w}b"]
        );
        let mut node = Node::with(groups);
        assert_eq!(
            planned(&mut node, &keys_form(&["{w}s"]), false),
            ["+{w}a", "+{x}stray", "+{w}b"]
        );
    }

    #[test]
    fn slots_are_the_servers() {
        // (key, CLUSTER KEYSLOT)
        let cases: [(&[u8], u16); 7] = [
            (b"foo", 12182),
            (b"bar", 5061),
            (b"123456789", 12739),
            (b"{foo}bar", 12182),
            (b"x{foo}y{bar}", 12182),
            // An empty tag hashes the whole key.
            (b"{}foo", key_slot(b"{}foo")),
            (b"", 0),
        ];
        for (key, slot) in cases {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
        assert_ne!(key_slot(b"{}foo"), key_slot(b"foo"));
        assert_eq!(key_slot(b"{foo"), crc16_xmodem(b"{foo") & 0x3fff);
    }
}
