//! The book's tables that mirror the code, generated from the code: every error reply
//! (model/src/error.rs), every config (the `configurations` of `redis_module!` in
//! src/lib.rs, with model/src/config.rs and the `AllkeysEviction` choices), every
//! field of `INFO lease` (src/commands/stats.rs), every keyspace notification
//! (model/src/notifications.rs and each `rm::notify` call under src/), and the test
//! files with what each proves (the `//!` header of each tests/*.rs). And
//! redis.conf.example, which `scripts/start` runs with, shows every config.
//!
//! Each table lives in its page between `<!-- BEGIN GENERATED <name> ... -->` and
//! `<!-- END GENERATED <name> -->`; the text around it is written by hand. A test per
//! table fails when the committed page differs from what the source generates, and
//! `LEASE_UPDATE_DOCS=1 cargo nextest run --release --test docs` rewrites them. No
//! server is needed.
//!
//! The readers are small and strict: whatever they do not recognise (an item kind, a
//! config flag, a field without its comment, a notification sent under a literal name)
//! fails the test with the file and line, rather than leaving a row out. Each rule has
//! a planted error here that it must reject (the `planted_*` tests), made by doctoring
//! a copy of the real source.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const UPDATE_DOCS: &str = "LEASE_UPDATE_DOCS";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---------------------------------------------------------------------------
// Reading Rust source text
// ---------------------------------------------------------------------------

/// The text of a `///` or `//` comment line, without its marker.
fn comment_text<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = line.trim_start().strip_prefix(marker)?;
    if marker == "//" && (rest.starts_with('/') || rest.starts_with('!')) {
        return None;
    }
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

/// Doc lines as paragraphs, each joined into one line.
fn paragraphs(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in lines {
        if line.trim().is_empty() {
            if !current.is_empty() {
                out.push(current.join(" "));
                current.clear();
            }
        } else {
            current.push(line.trim());
        }
    }
    if !current.is_empty() {
        out.push(current.join(" "));
    }
    out
}

/// The string literals of a piece of Rust (plain and `c"..."`), unescaped as far as
/// the sources here need (`\"` and `\\`).
fn string_literals(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            // A char literal such as '"' must not open a string; a lifetime
            // ('a, 'static) has no closing quote and is left alone.
            let ahead: Vec<char> = chars.clone().take(3).collect();
            match ahead.as_slice() {
                ['\\', _, '\'', ..] => (0..3).for_each(|_| {
                    chars.next();
                }),
                [_, '\'', ..] => (0..2).for_each(|_| {
                    chars.next();
                }),
                _ => {}
            }
            continue;
        }
        if c != '"' {
            continue;
        }
        let mut lit = String::new();
        loop {
            match chars.next() {
                None => return Err(format!("an unterminated string in {text:?}")),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('"') => lit.push('"'),
                    Some('\\') => lit.push('\\'),
                    Some('n') => lit.push('\n'),
                    Some('\n') => {
                        // A line continuation: the next line's indentation goes.
                        while chars.peek().is_some_and(|c| c.is_whitespace()) {
                            chars.next();
                        }
                    }
                    other => {
                        return Err(format!("an escape the reader does not know: \\{other:?}"))
                    }
                },
                Some(other) => lit.push(other),
            }
        }
        out.push(lit);
    }
    Ok(out)
}

/// A source file's lines, numbered from 1, up to its `#[cfg(test)] mod`.
fn code_lines(src: &str) -> Vec<(usize, &str)> {
    let lines: Vec<(usize, &str)> = src.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].1.trim() == "#[cfg(test)]" && w[1].1.trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// A Markdown table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// A code span in a table cell.
fn code(text: &str) -> String {
    format!("`{}`", cell(text))
}

// ---------------------------------------------------------------------------
// Errors: model/src/error.rs
// ---------------------------------------------------------------------------

const ERROR_RS: &str = "model/src/error.rs";

#[derive(Debug)]
struct ErrorRow {
    reply: String,
    when: String,
    source: String,
}

/// Every reply of error.rs: each `pub const NAME: &CStr = c"..."` with its doc
/// comment (when it is sent), and each `pub fn name(...) -> String` whose doc
/// comment's first paragraph is the reply in backticks with `<placeholders>`, the
/// rest when it is sent; every error text the function's body holds must read as
/// that reply. `pub fn ... -> Message` (a mapping onto the others) and `pub enum`
/// are passed over; anything else is an error.
fn parse_errors(src: &str) -> Result<Vec<ErrorRow>, String> {
    let lines = code_lines(src);
    let mut rows = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut i = 0;
    let at = |n: usize| format!("{ERROR_RS}:{n}");
    while i < lines.len() {
        let (n, line) = lines[i];
        let t = line.trim();
        i += 1;
        if let Some(text) = comment_text(line, "///") {
            doc.push(text.to_string());
            continue;
        }
        let item_follows =
            t.starts_with("pub const") || t.starts_with("pub fn") || t.starts_with("pub enum");
        if !doc.is_empty() && !item_follows {
            return Err(format!("{}: a doc comment not followed by a reply", at(n)));
        }
        if t.is_empty() || t.starts_with("//!") || comment_text(line, "//").is_some() {
            continue;
        }
        if t.starts_with("use ") && t.ends_with(';') {
            continue;
        }
        // The item's whole text, up to its `;` or its closing brace.
        let mut item = vec![line];
        if t.starts_with("pub const") {
            while !item.last().is_some_and(|l| l.trim_end().ends_with(';')) {
                let Some((_, next)) = lines.get(i) else {
                    return Err(format!("{}: a constant without its `;`", at(n)));
                };
                item.push(next);
                i += 1;
            }
            let text = item.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
            let Some(rest) = text.strip_prefix("pub const ") else {
                unreachable!()
            };
            let (name, value) = rest.split_once(": &CStr =").ok_or_else(|| {
                format!("{}: a constant that is not `NAME: &CStr = c\"...\"`", at(n))
            })?;
            let value = value.trim();
            if !(value.starts_with("c\"") && value.ends_with("\";")) {
                return Err(format!("{}: {name} is not a C string literal", at(n)));
            }
            let literals = string_literals(value)?;
            let [reply] = literals.as_slice() else {
                return Err(format!("{}: {name} is not one literal", at(n)));
            };
            if doc.is_empty() {
                return Err(format!(
                    "{}: {name} has no doc comment saying when it is sent",
                    at(n)
                ));
            }
            rows.push(ErrorRow {
                reply: reply.clone(),
                when: paragraphs(&doc).join(" "),
                source: name.trim().to_string(),
            });
            doc.clear();
            continue;
        }
        if t.starts_with("pub fn") || t.starts_with("pub enum") {
            while !item.last().is_some_and(|l| *l == "}") {
                let Some((_, next)) = lines.get(i) else {
                    return Err(format!("{}: an item without its closing brace", at(n)));
                };
                item.push(next);
                i += 1;
            }
            if t.starts_with("pub enum") {
                doc.clear();
                continue;
            }
            let name = t
                .strip_prefix("pub fn ")
                .unwrap_or(t)
                .split('(')
                .next()
                .unwrap_or_default()
                .to_string();
            if t.ends_with("-> Message {") {
                doc.clear();
                continue;
            }
            if !t.ends_with("-> String {") {
                return Err(format!(
                    "{}: {name} returns neither String nor Message",
                    at(n)
                ));
            }
            let paras = paragraphs(&doc);
            let reply = paras
                .first()
                .and_then(|p| p.strip_prefix('`'))
                .and_then(|p| p.strip_suffix('`'))
                .ok_or_else(|| {
                    format!(
                        "{}: {name}'s doc comment does not start with its reply in backticks",
                        at(n)
                    )
                })?;
            if paras.len() < 2 {
                return Err(format!(
                    "{}: {name}'s doc comment does not say when it is sent",
                    at(n)
                ));
            }
            let body = item[1..].join("\n");
            let texts: Vec<String> = string_literals(&body)?
                .into_iter()
                .filter(|l| {
                    l.split(' ').next().is_some_and(|code| {
                        code.len() > 1 && code.chars().all(|c| c.is_ascii_uppercase())
                    })
                })
                .collect();
            if texts.is_empty() {
                return Err(format!("{}: {name} holds no error text", at(n)));
            }
            for text in &texts {
                if !matches_reply(reply, text) {
                    return Err(format!("{}: {name} sends {text:?}, which its doc comment does not describe ({reply:?})", at(n)));
                }
            }
            rows.push(ErrorRow {
                reply: reply.to_string(),
                when: paras[1..].join(" "),
                source: format!("{name}()"),
            });
            doc.clear();
            continue;
        }
        return Err(format!("{}: an item the reader does not know: {t}", at(n)));
    }
    let mut seen = BTreeSet::new();
    for row in &rows {
        if !seen.insert(row.reply.clone()) {
            return Err(format!("{ERROR_RS}: {} is defined twice", row.reply));
        }
    }
    Ok(rows)
}

/// Whether an error text from a function's body (`{...}` its holes) reads as the
/// documented reply (`<...>` its holes).
fn matches_reply(documented: &str, text: &str) -> bool {
    fn pieces(s: &str, open: char, close: char) -> Vec<String> {
        let mut out = vec![String::new()];
        let mut inside = false;
        for c in s.chars() {
            match c {
                c if c == open && !inside => {
                    inside = true;
                    out.push(String::new());
                }
                c if c == close && inside => inside = false,
                _ if inside => {}
                c => out.last_mut().expect("one piece").push(c),
            }
        }
        out
    }
    // The documented reply as fixed pieces between holes; the text must hold them
    // in order, with each of its own holes inside one of the documented ones.
    let fixed = pieces(documented, '<', '>');
    let shown = text.replace("{{", "\u{1}").replace("}}", "\u{2}");
    let mut flat = String::new();
    let mut inside = false;
    for c in shown.chars() {
        match c {
            '{' => {
                inside = true;
                flat.push('\u{0}');
            }
            '}' => inside = false,
            _ if inside => {}
            c => flat.push(c),
        }
    }
    let flat = flat.replace('\u{1}', "{").replace('\u{2}', "}");
    // Holes match any text, the text's own holes included.
    let mut rest = flat.as_str();
    for (k, piece) in fixed.iter().enumerate() {
        let piece = piece.as_str();
        if k == 0 {
            let Some(after) = rest.strip_prefix(piece) else {
                return false;
            };
            rest = after;
        } else if k == fixed.len() - 1 {
            return rest.ends_with(piece) && rest.len() >= piece.len();
        } else {
            let Some(pos) = rest.find(piece) else {
                return false;
            };
            rest = &rest[pos + piece.len()..];
        }
    }
    fixed.len() > 1 || rest.is_empty()
}

fn errors_table(rows: &[ErrorRow]) -> String {
    let mut s = String::from("| reply | when | in `model/src/error.rs` |\n|---|---|---|\n");
    for row in rows {
        s.push_str(&format!(
            "| {} | {} | {} |\n",
            code(&row.reply),
            cell(&row.when),
            code(&row.source)
        ));
    }
    s
}

// ---------------------------------------------------------------------------
// Configs: src/lib.rs, model/src/config.rs, the AllkeysEviction enum
// ---------------------------------------------------------------------------

const LIB_RS: &str = "src/lib.rs";
const CONFIG_RS: &str = "model/src/config.rs";

#[derive(Debug, PartialEq)]
struct ConfigRow {
    name: String,
    default: String,
    range: String,
    meaning: String,
}

type Consts = BTreeMap<String, (String, Vec<String>)>;

fn lookup<'a>(known: &'a Consts, name: &str) -> Result<&'a (String, Vec<String>), String> {
    known
        .get(name)
        .ok_or_else(|| format!("{CONFIG_RS}: no constant {name}"))
}

/// `pub const NAME: TYPE = value;` items of a file with their doc comments.
fn consts(src: &str) -> Consts {
    let mut out = BTreeMap::new();
    let mut doc = Vec::new();
    for (_, line) in code_lines(src) {
        if let Some(text) = comment_text(line, "///") {
            doc.push(text.to_string());
            continue;
        }
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("pub const ") {
            if let Some((name, value)) = rest.split_once('=') {
                let name = name
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                out.insert(
                    name,
                    (
                        value.trim().trim_end_matches(';').trim().to_string(),
                        doc.clone(),
                    ),
                );
            }
        }
        doc.clear();
    }
    out
}

fn number(value: &str, what: &str) -> Result<i64, String> {
    value
        .replace('_', "")
        .parse::<i64>()
        .map_err(|_| format!("{CONFIG_RS}: {what} is not a number: {value:?}"))
}

/// The `[...]` entries of one section (`i64: [`, `enum: [`, ...) of the
/// `configurations` block: each entry on one line, as rustfmt leaves them here.
fn config_sections(lib: &str) -> Result<BTreeMap<String, Vec<(usize, String)>>, String> {
    let lines = code_lines(lib);
    let start = lines
        .iter()
        .position(|(_, l)| l.trim() == "configurations: [")
        .ok_or_else(|| format!("{LIB_RS}: no `configurations: [` in redis_module!"))?;
    let mut sections: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for &(n, line) in &lines[start + 1..] {
        let t = line.trim();
        if t == "]" {
            return Ok(sections);
        }
        if let Some(kind) = t.strip_suffix(": [],") {
            sections.entry(kind.to_string()).or_default();
            continue;
        }
        if let Some(kind) = t.strip_suffix(": [") {
            current = Some(kind.to_string());
            sections.entry(kind.to_string()).or_default();
            continue;
        }
        if t == "]," {
            current = None;
            continue;
        }
        if t == "module_args_as_configuration: false," {
            continue;
        }
        match (&current, t.starts_with('[') && t.ends_with("],")) {
            (Some(kind), true) => sections
                .get_mut(kind)
                .expect("section")
                .push((n, t[1..t.len() - 2].to_string())),
            _ => {
                return Err(format!(
                    "{LIB_RS}:{n}: a configurations line the reader does not know: {t}"
                ))
            }
        }
    }
    Err(format!("{LIB_RS}: the configurations block does not end"))
}

/// An enum's variant and its doc comment lines.
type Variant = (String, Vec<String>);

/// The doc comment over `pub enum <name>` in a file, and each variant with its own.
fn enum_choices(src: &str, name: &str, file: &str) -> Result<(Vec<String>, Vec<Variant>), String> {
    let lines = code_lines(src);
    let open = format!("pub enum {name} {{");
    let at = lines
        .iter()
        .position(|(_, l)| l.trim() == open)
        .ok_or_else(|| format!("{file}: no `{open}`"))?;
    let mut doc = Vec::new();
    for &(_, line) in lines[..at].iter().rev() {
        let t = line.trim();
        if t.starts_with("#[") {
            continue;
        }
        match comment_text(line, "///") {
            Some(text) => doc.insert(0, text.to_string()),
            None => break,
        }
    }
    let mut variants = Vec::new();
    let mut vdoc = Vec::new();
    for &(n, line) in &lines[at + 1..] {
        let t = line.trim();
        if t == "}" {
            return Ok((doc, variants));
        }
        if let Some(text) = comment_text(line, "///") {
            vdoc.push(text.to_string());
            continue;
        }
        let (variant, _) = t
            .split_once(" = ")
            .ok_or_else(|| format!("{file}:{n}: a variant the reader does not know: {t}"))?;
        if vdoc.is_empty() {
            return Err(format!(
                "{file}:{n}: the choice {variant} has no doc comment"
            ));
        }
        variants.push((variant.to_string(), std::mem::take(&mut vdoc)));
    }
    Err(format!("{file}: {name} does not end"))
}

/// The list literal of `pub const NAME: &[&str] = &[...];`, constants resolved.
fn str_list(src: &str, name: &str, consts: &Consts) -> Result<Vec<String>, String> {
    let start = src
        .find(&format!("pub const {name}: &[&str] = &["))
        .ok_or_else(|| format!("{CONFIG_RS}: no list {name}"))?;
    let body = &src[start..];
    let open = body.find("= &[").map(|p| p + 4).unwrap_or(0);
    let end = body
        .find("];")
        .ok_or_else(|| format!("{CONFIG_RS}: {name} does not end"))?;
    body[open..end]
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(
            |item| match item.strip_prefix('"').and_then(|i| i.strip_suffix('"')) {
                Some(text) => Ok(text.to_string()),
                None => consts
                    .get(item)
                    .and_then(|(v, _)| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
                    .map(String::from)
                    .ok_or_else(|| {
                        format!("{CONFIG_RS}: {name} names {item}, which is not a string constant")
                    }),
            },
        )
        .collect()
}

/// Every config the module registers, from lib.rs's `configurations`, with its
/// bounds and meaning from config.rs (the first paragraph of the doc comment of its
/// `*_DEFAULT`) or, for an enum, its choices and their doc comments. Checked against
/// what `loadmodule` arguments accept (config.rs's `NAMES`, `NUMERIC` and
/// `ALLKEYS_EVICTION_CHOICES`), which must agree.
fn parse_configs(
    lib: &str,
    config: &str,
    sources: &BTreeMap<String, String>,
) -> Result<Vec<ConfigRow>, String> {
    let sections = config_sections(lib)?;
    let known = consts(config);
    let get = |name: &str| lookup(&known, name);
    let mut rows = Vec::new();
    for (kind, entries) in &sections {
        match kind.as_str() {
            "i64" | "enum" => {}
            _ if entries.is_empty() => continue,
            other => {
                return Err(format!(
                    "{LIB_RS}: {other} configs: the reader does not know them yet"
                ))
            }
        }
        for (n, entry) in entries {
            let parts: Vec<&str> = entry.split(", ").map(str::trim).collect();
            if kind == "i64" {
                let [name, value, default, min, max, "ConfigurationFlags::DEFAULT", "None"] =
                    parts.as_slice()
                else {
                    return Err(format!(
                        "{LIB_RS}:{n}: an i64 config the reader does not know: {entry}"
                    ));
                };
                let strip = |s: &str| {
                    s.strip_prefix("config::")
                        .map(String::from)
                        .ok_or_else(|| format!("{LIB_RS}:{n}: {s} is not in config.rs"))
                };
                let (default, min, max) = (strip(default)?, strip(min)?, strip(max)?);
                let value = value
                    .strip_prefix("&config::")
                    .ok_or_else(|| format!("{LIB_RS}:{n}: {value} is not in config.rs"))?;
                let name = name.trim_matches('"');
                if !default.ends_with("_DEFAULT") {
                    return Err(format!(
                        "{LIB_RS}:{n}: {name}'s default {default} is not a *_DEFAULT constant"
                    ));
                }
                let (default_value, doc) = get(&default)?;
                let meaning = paragraphs(doc).into_iter().next().ok_or_else(|| {
                    format!("{CONFIG_RS}: {default} has no doc comment saying what {name} means")
                })?;
                let (lo, hi) = (number(&get(&min)?.0, &min)?, number(&get(&max)?.0, &max)?);
                // What loadmodule arguments accept must be what CONFIG SET accepts.
                let numeric = format!("name: \"{name}\",\n        value: &{value},\n        min: {min},\n        max: {max},");
                if !config.contains(&numeric) {
                    return Err(format!("{CONFIG_RS}: NUMERIC has no entry for {name} with &{value}, {min} and {max}, as lib.rs registers it"));
                }
                rows.push(ConfigRow {
                    name: name.to_string(),
                    default: number(default_value, &default)?.to_string(),
                    range: format!("{lo}–{hi}"),
                    meaning,
                });
            } else {
                let [name, _value, default, "ConfigurationFlags::DEFAULT", "None"] =
                    parts.as_slice()
                else {
                    return Err(format!(
                        "{LIB_RS}:{n}: an enum config the reader does not know: {entry}"
                    ));
                };
                let name = name.trim_matches('"');
                let path: Vec<&str> = default.split("::").collect();
                let [_module, ty, default] = path.as_slice() else {
                    return Err(format!(
                        "{LIB_RS}:{n}: {default} is not module::Enum::choice"
                    ));
                };
                let defining: Vec<(&String, &String)> = sources
                    .iter()
                    .filter(|(_, src)| src.contains(&format!("pub enum {ty} {{")))
                    .collect();
                let [(file, src)] = defining.as_slice() else {
                    return Err(format!(
                        "{LIB_RS}:{n}: {ty} is defined in {} files",
                        defining.len()
                    ));
                };
                let (doc, variants) = enum_choices(src, ty, file)?;
                let first = paragraphs(&doc).into_iter().next().ok_or_else(|| {
                    format!("{file}: {ty} has no doc comment saying what {name} means")
                })?;
                let choices: Vec<String> = variants.iter().map(|(v, _)| v.clone()).collect();
                if !choices.iter().any(|c| c == default) {
                    return Err(format!(
                        "{LIB_RS}:{n}: the default {default} is not a choice of {ty}"
                    ));
                }
                let accepted = str_list(config, "ALLKEYS_EVICTION_CHOICES", &known)?;
                if name == "allkeys-eviction" && accepted != choices {
                    return Err(format!("{CONFIG_RS}: ALLKEYS_EVICTION_CHOICES {accepted:?} are not {ty}'s choices {choices:?}"));
                }
                let each: Vec<String> = variants
                    .iter()
                    .map(|(v, d)| format!("`{v}`: {}", paragraphs(d).join(" ")))
                    .collect();
                rows.push(ConfigRow {
                    name: name.to_string(),
                    default: format!("`{default}`"),
                    range: choices
                        .iter()
                        .map(|c| format!("`{c}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    meaning: format!("{first} {}", each.join(" ")),
                });
            }
        }
    }
    let registered: BTreeSet<String> = rows.iter().map(|r| r.name.clone()).collect();
    let accepted: BTreeSet<String> = str_list(config, "NAMES", &known)?.into_iter().collect();
    if registered != accepted {
        return Err(format!("{CONFIG_RS}: NAMES {accepted:?} (what loadmodule accepts) are not the configs lib.rs registers {registered:?}"));
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

fn configs_table(rows: &[ConfigRow]) -> String {
    let mut s = String::from("| config | default | range | meaning |\n|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| `lease.{}` | {} | {} | {} |\n",
            r.name,
            r.default,
            r.range,
            cell(&r.meaning)
        ));
    }
    s
}

fn all_sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .expect("a source folder")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(repo())
                    .expect("in the repo")
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, fs::read_to_string(&path).expect("source"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&repo().join("src"), &mut out);
    walk(&repo().join("model/src"), &mut out);
    out
}

// ---------------------------------------------------------------------------
// INFO lease: src/commands/stats.rs
// ---------------------------------------------------------------------------

const STATS_RS: &str = "src/commands/stats.rs";

/// Every field `info` adds (`add(c"name", ...)` or `add_text(c"name", ...)`, the
/// call on one line or its name on the next), each with the `//` comment right over
/// it; any other C string in the function is an error.
fn parse_info(src: &str) -> Result<Vec<(String, String)>, String> {
    let lines = code_lines(src);
    let start = lines
        .iter()
        .position(|(_, l)| l.contains("fn info("))
        .ok_or_else(|| format!("{STATS_RS}: no fn info"))?;
    let mut fields = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    let mut i = start + 1;
    while i < lines.len() {
        let (n, line) = lines[i];
        i += 1;
        let t = line.trim();
        if let Some(text) = comment_text(line, "//") {
            comment.push(text.to_string());
            continue;
        }
        let call = ["add(", "add_text("]
            .iter()
            .find(|p| t.starts_with(**p))
            .copied();
        let mut text = t.to_string();
        if call.is_some() && !t.contains("c\"") {
            if let Some((_, next)) = lines.get(i) {
                text.push_str(next.trim());
                i += 1;
            }
        }
        let names: Vec<String> = if text.contains("c\"") {
            string_literals(&text)?
        } else {
            Vec::new()
        };
        match (call, names.as_slice()) {
            (Some(_), [name, ..]) => {
                if comment.is_empty() || comment[0].starts_with("SAFETY:") {
                    return Err(format!("{STATS_RS}:{n}: the field {name} has no comment saying what it is"));
                }
                fields.push((format!("lease_{name}"), comment.join(" ")));
            }
            (None, [name, ..]) => {
                return Err(format!("{STATS_RS}:{n}: {name:?} outside an add or add_text call: a field the reader cannot see"))
            }
            _ => {}
        }
        comment.clear();
        if line == "}" {
            break;
        }
    }
    if fields.is_empty() {
        return Err(format!("{STATS_RS}: no field found"));
    }
    Ok(fields)
}

fn info_table(fields: &[(String, String)]) -> String {
    let mut s = String::from("| field | what it is |\n|---|---|\n");
    for (name, meaning) in fields {
        s.push_str(&format!("| `{name}` | {} |\n", cell(meaning)));
    }
    s
}

// ---------------------------------------------------------------------------
// Keyspace notifications: model/src/notifications.rs and every rm::notify
// ---------------------------------------------------------------------------

const NOTIFICATIONS_RS: &str = "model/src/notifications.rs";
/// The one commit path, which sends the notification a change names.
const COMMIT_RS: &str = "src/keyspace/commit/mod.rs";

/// The notifications of notifications.rs (each `pub const NAME: &CStr = c"..."`
/// with its doc comment), and the files that send each: every `rm::notify(` call
/// under src/ must name one as `notifications::NAME`, every one must be sent, and
/// no other file may hold a `c"lease.` literal.
fn parse_notifications(
    sources: &BTreeMap<String, String>,
) -> Result<Vec<(String, String, Vec<String>)>, String> {
    let defs = sources
        .get(NOTIFICATIONS_RS)
        .ok_or_else(|| format!("{NOTIFICATIONS_RS}: missing"))?;
    let mut events: Vec<(String, String, String)> = Vec::new(); // (const, event, doc)
    let mut doc = Vec::new();
    for (n, line) in code_lines(defs) {
        let t = line.trim();
        if let Some(text) = comment_text(line, "///") {
            doc.push(text.to_string());
            continue;
        }
        if t.is_empty() || t.starts_with("//!") || t.starts_with("use ") {
            continue;
        }
        let rest = t.strip_prefix("pub const ").ok_or_else(|| {
            format!("{NOTIFICATIONS_RS}:{n}: an item the reader does not know: {t}")
        })?;
        let (name, value) = rest
            .split_once(": &CStr = ")
            .ok_or_else(|| format!("{NOTIFICATIONS_RS}:{n}: not `NAME: &CStr = c\"...\";`"))?;
        let literals = string_literals(value)?;
        let [event] = literals.as_slice() else {
            return Err(format!("{NOTIFICATIONS_RS}:{n}: {name} is not one literal"));
        };
        if !event.starts_with("lease.") {
            return Err(format!(
                "{NOTIFICATIONS_RS}:{n}: {event} does not start with lease."
            ));
        }
        if doc.is_empty() {
            return Err(format!(
                "{NOTIFICATIONS_RS}:{n}: {name} has no doc comment saying when it is sent"
            ));
        }
        events.push((name.to_string(), event.clone(), paragraphs(&doc).join(" ")));
        doc.clear();
    }
    let mut senders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, src) in sources {
        if file == NOTIFICATIONS_RS {
            continue;
        }
        let code: String = code_lines(src)
            .iter()
            .map(|(_, l)| *l)
            .collect::<Vec<_>>()
            .join("\n");
        if let Some(pos) = code.find("c\"lease.") {
            let line = code[..pos].lines().count();
            return Err(format!(
                "{file}:{line}: a c\"lease.\" literal: name the notification in {NOTIFICATIONS_RS}"
            ));
        }
        // A change decided in the model names its event (`notify:
        // Some(notifications::X)` or `then_some(notifications::X)`,
        // model/src/change.rs, or a change that
        // only announces, `Change::announced(notifications::X)`); the
        // commit path sends it.
        for named in [
            "Some(notifications::",
            "then_some(notifications::",
            "Change::announced(notifications::",
        ] {
            let mut rest = code.as_str();
            while let Some(pos) = rest.find(named) {
                let line = code[..code.len() - rest.len() + pos].lines().count();
                let tail = &rest[pos + named.len()..];
                let name: String = tail
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !events.iter().any(|(c, _, _)| *c == name) {
                    return Err(format!("{file}:{line}: a change names notifications::{name}, which {NOTIFICATIONS_RS} does not define"));
                }
                let shown = file.strip_prefix("src/").unwrap_or(file).to_string();
                senders.entry(name).or_default().insert(shown);
                rest = tail;
            }
        }
        let mut rest = code.as_str();
        while let Some(pos) = rest.find("rm::notify(") {
            let line = code.len() - rest.len() + pos;
            let line = code[..line].lines().count();
            let args_start = pos + "rm::notify(".len();
            let mut depth = 1;
            let mut end = args_start;
            for (k, c) in rest[args_start..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = args_start + k;
                    break;
                }
            }
            let args: Vec<&str> = rest[args_start..end].split(',').map(str::trim).collect();
            let event = args.get(1).copied().unwrap_or_default();
            if file == COMMIT_RS && event == "event" {
                // The commit path sends the event its change names (above).
                rest = &rest[end..];
                continue;
            }
            let name = event
                .strip_prefix("notifications::")
                .or_else(|| event.strip_prefix("crate::model::notifications::"))
                .ok_or_else(|| {
                    format!(
                        "{file}:{line}: rm::notify sends {event}, not a notifications:: constant"
                    )
                })?;
            if !events.iter().any(|(c, _, _)| c == name) {
                return Err(format!("{file}:{line}: rm::notify sends notifications::{name}, which {NOTIFICATIONS_RS} does not define"));
            }
            let shown = file.strip_prefix("src/").unwrap_or(file).to_string();
            senders.entry(name.to_string()).or_default().insert(shown);
            rest = &rest[end..];
        }
    }
    events
        .into_iter()
        .map(|(name, event, doc)| match senders.remove(&name) {
            Some(files) => Ok((event, doc, files.into_iter().collect())),
            None => Err(format!(
                "{NOTIFICATIONS_RS}: {name} ({event}) is never sent"
            )),
        })
        .collect()
}

fn notifications_table(rows: &[(String, String, Vec<String>)]) -> String {
    let mut s = String::from("| event | when | sent from |\n|---|---|---|\n");
    for (event, doc, files) in rows {
        let files: Vec<String> = files.iter().map(|f| format!("`{f}`")).collect();
        s.push_str(&format!(
            "| `{event}` | {} | {} |\n",
            cell(doc),
            files.join(", ")
        ));
    }
    s
}

// ---------------------------------------------------------------------------
// The test files: tests/*.rs
// ---------------------------------------------------------------------------

/// Each test file with the first paragraph of its `//!` header, which every test
/// file must have.
fn parse_test_files(files: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, String> {
    files
        .iter()
        .map(|(name, src)| {
            let header: Vec<String> = src
                .lines()
                .map_while(|l| l.strip_prefix("//!"))
                .map(|l| l.strip_prefix(' ').unwrap_or(l).to_string())
                .collect();
            let first = paragraphs(&header)
                .into_iter()
                .next()
                .ok_or_else(|| format!("{name}: no //! header saying what the file tests"))?;
            Ok((name.clone(), first))
        })
        .collect()
}

fn test_files() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(repo().join("tests")).expect("tests/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = format!(
                "tests/{}",
                path.file_name().expect("name").to_string_lossy()
            );
            out.insert(name, fs::read_to_string(&path).expect("test file"));
        }
    }
    out
}

fn tests_table(rows: &[(String, String)]) -> String {
    let mut s = String::from("| file | what it proves |\n|---|---|\n");
    for (file, what) in rows {
        s.push_str(&format!("| `{file}` | {} |\n", cell(what)));
    }
    s
}

// ---------------------------------------------------------------------------
// Generated regions of the book's pages
// ---------------------------------------------------------------------------

/// A table as its page holds it, between its markers.
fn region(name: &str, from: &str, table: &str) -> String {
    format!(
        "<!-- BEGIN GENERATED {name} by tests/docs.rs from {from}: edit the source, then run\n     \
         {UPDATE_DOCS}=1 cargo nextest run --release --test docs -->\n\n{table}\n<!-- END GENERATED {name} -->"
    )
}

/// The page with its region replaced by `generated`; an error if the page does not
/// hold the region's markers exactly once.
fn with_region(page: &str, name: &str, generated: &str) -> Result<String, String> {
    let begin = format!("<!-- BEGIN GENERATED {name} ");
    let end = format!("<!-- END GENERATED {name} -->");
    if page.matches(&begin).count() != 1 || page.matches(&end).count() != 1 {
        return Err(format!(
            "the page must hold `{begin}...-->` and `{end}` once each"
        ));
    }
    let start = page.find(&begin).expect("counted");
    let stop = page.find(&end).expect("counted") + end.len();
    if stop < start {
        return Err(format!("{end} comes before its beginning"));
    }
    Ok(format!("{}{generated}{}", &page[..start], &page[stop..]))
}

/// Compares (or, with LEASE_UPDATE_DOCS=1, rewrites) one generated region.
fn check_region(page_path: &str, name: &str, from: &str, table: Result<String, String>) {
    let table = table.unwrap_or_else(|e| panic!("{e}"));
    let page = read(page_path);
    let generated = region(name, from, &table);
    let expected =
        with_region(&page, name, &generated).unwrap_or_else(|e| panic!("{page_path}: {e}"));
    if std::env::var_os(UPDATE_DOCS).is_some_and(|v| v == "1") {
        fs::write(repo().join(page_path), &expected).unwrap_or_else(|e| panic!("{page_path}: {e}"));
        return;
    }
    if page != expected {
        let line = page
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| page.lines().count().min(expected.lines().count()));
        panic!(
            "{page_path}: the {name} table is not what {from} generates (first difference at line {}): \
             run `{UPDATE_DOCS}=1 cargo nextest run --release --test docs` and commit the result",
            line + 1
        );
    }
}

const ERRORS_MD: &str = "docs/src/reference/errors.md";
const CONFIG_MD: &str = "docs/src/operations/configuration.md";
const OBSERVABILITY_MD: &str = "docs/src/operations/observability.md";
const TESTS_MD: &str = "docs/src/proof/test-matrix.md";

#[test]
fn errors_table_is_generated() {
    check_region(
        ERRORS_MD,
        "errors",
        ERROR_RS,
        parse_errors(&read(ERROR_RS)).map(|r| errors_table(&r)),
    );
}

#[test]
fn configs_table_is_generated() {
    let rows = parse_configs(&read(LIB_RS), &read(CONFIG_RS), &all_sources());
    check_region(
        CONFIG_MD,
        "configs",
        "src/lib.rs and model/src/config.rs",
        rows.map(|r| configs_table(&r)),
    );
}

/// The configs redis.conf.example shows, each as `# lease.<name> <default>`: the
/// example `scripts/start` runs with must not fall behind the module.
fn example_lists(example: &str, rows: &[ConfigRow]) -> Result<(), String> {
    for row in rows {
        let line = format!("# lease.{} {}", row.name, row.default.trim_matches('`'));
        if !example.lines().any(|l| l.trim() == line) {
            return Err(format!("redis.conf.example: no `{line}` line"));
        }
    }
    Ok(())
}

#[test]
fn the_example_config_lists_every_config() {
    let rows = parse_configs(&read(LIB_RS), &read(CONFIG_RS), &all_sources())
        .unwrap_or_else(|e| panic!("{e}"));
    let example = read("redis.conf.example");
    example_lists(&example, &rows).unwrap_or_else(|e| panic!("{e}"));
    rejected(
        "a config the example leaves out",
        example_lists(
            &doctored(&example, "# lease.max-holders 10000\n", ""),
            &rows,
        ),
        "no `# lease.max-holders 10000` line",
    );
}

#[test]
fn info_fields_are_generated() {
    check_region(
        OBSERVABILITY_MD,
        "info",
        STATS_RS,
        parse_info(&read(STATS_RS)).map(|f| info_table(&f)),
    );
}

#[test]
fn notifications_are_generated() {
    let rows = parse_notifications(&all_sources());
    check_region(
        OBSERVABILITY_MD,
        "notifications",
        "model/src/notifications.rs and every rm::notify",
        rows.map(|r| notifications_table(&r)),
    );
}

#[test]
fn test_matrix_is_generated() {
    check_region(
        TESTS_MD,
        "tests",
        "the //! header of each tests/*.rs",
        parse_test_files(&test_files()).map(|r| tests_table(&r)),
    );
}

// ---------------------------------------------------------------------------
// Planted errors: each rule rejects a doctored copy of the real source
// ---------------------------------------------------------------------------

/// `src` with `old` (which must be there) replaced by `new`.
fn doctored(src: &str, old: &str, new: &str) -> String {
    assert!(
        src.contains(old),
        "the planted error needs {old:?} in the source"
    );
    src.replacen(old, new, 1)
}

fn rejected<T: std::fmt::Debug>(what: &str, result: Result<T, String>, says: &str) {
    match result {
        Ok(found) => panic!("{what}: accepted: {found:?}"),
        Err(e) => assert!(
            e.contains(says),
            "{what}: rejected, but for another reason: {e}"
        ),
    }
}

#[test]
fn planted_errors_in_error_rs_are_rejected() {
    let src = read(ERROR_RS);
    assert!(parse_errors(&src).is_ok());
    rejected(
        "a constant without a doc comment",
        parse_errors(&doctored(
            &src,
            "/// The key holds a value of another type.\n",
            "",
        )),
        "WRONGTYPE has no doc comment",
    );
    rejected(
        "a reply that is not a C string",
        parse_errors(&doctored(
            &src,
            "pub const TOKEN: &CStr = c\"ERR",
            "pub const TOKEN: &str = \"ERR",
        )),
        "not `NAME: &CStr",
    );
    rejected(
        "a format that drifted from its doc comment",
        parse_errors(&doctored(
            &src,
            "format!(\"STALE fencing token {fence} is older",
            "format!(\"STALE fence {fence} is older",
        )),
        "stale sends",
    );
    rejected(
        "a function without its reply in backticks",
        parse_errors(&doctored(
            &src,
            "/// `ERR no live session on <session-key> for this token`\n",
            "",
        )),
        "no_live_session's doc comment",
    );
    rejected(
        "an item the reader does not know",
        parse_errors(&doctored(
            &src,
            "use std::ffi::CStr;\n",
            "use std::ffi::CStr;\npub static X: u8 = 0;\n",
        )),
        "does not know",
    );
    rejected(
        "a reply defined twice",
        parse_errors(&doctored(
            &src,
            "pub const TOKEN: &CStr = c\"ERR token must be 1 to 256 bytes\";",
            "pub const TOKEN: &CStr = c\"ERR token must be 1 to 256 bytes\";\n/// again\npub const TOKEN2: &CStr = c\"ERR token must be 1 to 256 bytes\";",
        )),
        "defined twice",
    );
}

#[test]
fn planted_errors_in_configs_are_rejected() {
    let (lib, config, sources) = (read(LIB_RS), read(CONFIG_RS), all_sources());
    assert!(parse_configs(&lib, &config, &sources).is_ok());
    rejected(
        "a config registered but not accepted by loadmodule",
        parse_configs(
            &lib,
            &doctored(
                &config,
                "    \"max-holders\",\n    ALLKEYS_EVICTION,",
                "    ALLKEYS_EVICTION,",
            ),
            &sources,
        ),
        "NAMES",
    );
    rejected(
        "loadmodule's range apart from CONFIG SET's",
        parse_configs(
            &lib,
            &doctored(&config, "min: REAP_HZ_MIN,", "min: REAP_BATCH_MIN,"),
            &sources,
        ),
        "NUMERIC has no entry for reap-hz",
    );
    rejected(
        "a flag the reader does not know",
        parse_configs(
            &doctored(
                &lib,
                "config::REAP_HZ_MAX, ConfigurationFlags::DEFAULT",
                "config::REAP_HZ_MAX, ConfigurationFlags::IMMUTABLE",
            ),
            &config,
            &sources,
        ),
        "an i64 config the reader does not know",
    );
    rejected(
        "a default without its meaning",
        parse_configs(
            &lib,
            &doctored(
                &config,
                "pub const REAP_HZ_DEFAULT",
                "const _UNDOCUMENTED: () = ();\npub const REAP_HZ_DEFAULT",
            ),
            &sources,
        ),
        "REAP_HZ_DEFAULT has no doc comment",
    );
    rejected(
        "a string config",
        parse_configs(&doctored(&lib, "string: [],", "string: [\n            [\"x\", &X, \"y\", ConfigurationFlags::DEFAULT, None],\n        ],"), &config, &sources),
        "string configs",
    );
    let mut changed = sources.clone();
    let eviction = changed
        .get_mut("src/background/eviction.rs")
        .expect("eviction.rs");
    *eviction = doctored(
        eviction,
        "        allow = 2,\n",
        "        allow = 2,\n        /// Another.\n        keep = 3,\n",
    );
    rejected(
        "a choice loadmodule does not accept",
        parse_configs(&lib, &config, &changed),
        "ALLKEYS_EVICTION_CHOICES",
    );
}

#[test]
fn planted_errors_in_info_fields_are_rejected() {
    let src = read(STATS_RS);
    assert!(parse_info(&src).is_ok());
    rejected(
        "a field without its comment",
        parse_info(&doctored(
            &src,
            "            // Counter: lock-delays started (`DELAY`).\n",
            "",
        )),
        "delays has no comment",
    );
    rejected(
        "a field added another way",
        parse_info(&doctored(
            &src,
            "add(c\"delays\", read(&STATS.delays));",
            "other(c\"delays\", read(&STATS.delays));",
        )),
        "outside an add or add_text call",
    );
}

#[test]
fn planted_errors_in_notifications_are_rejected() {
    let sources = all_sources();
    assert!(parse_notifications(&sources).is_ok());
    let plant = |file: &str, old: &str, new: &str| {
        let mut changed = sources.clone();
        let src = changed.get_mut(file).expect("file");
        *src = doctored(src, old, new);
        parse_notifications(&changed)
    };
    rejected(
        "a notification sent under a literal name",
        plant(
            "model/src/change.rs",
            "notifications::RENEW",
            "c\"lease.renewed\"",
        ),
        "a c\"lease.\" literal",
    );
    rejected(
        "a notification the file does not define",
        plant(
            "model/src/change.rs",
            "notifications::RENEW",
            "notifications::RENEWED",
        ),
        "does not define",
    );
    rejected(
        "a notification never sent",
        plant(NOTIFICATIONS_RS, "pub const FENCE", "/// Never sent.\npub const UNUSED: &CStr = c\"lease.unused\";\n\n/// x\npub const FENCE"),
        "UNUSED (lease.unused) is never sent",
    );
    rejected(
        "a notification without its meaning",
        plant(
            NOTIFICATIONS_RS,
            "/// On the lease key, at every `LEASE.RENEW` that answered 1.\n",
            "",
        ),
        "RENEW has no doc comment",
    );
}

#[test]
fn planted_errors_in_pages_and_test_files_are_rejected() {
    rejected(
        "a page without its markers",
        with_region("# Errors\n", "errors", "x"),
        "must hold",
    );
    let page = read(ERRORS_MD);
    let table = errors_table(&parse_errors(&read(ERROR_RS)).expect("errors"));
    let stale = doctored(&page, "| `WRONGTYPE Operation", "| `WRONGTYPE An operation");
    let expected =
        with_region(&stale, "errors", &region("errors", ERROR_RS, &table)).expect("region");
    assert_ne!(
        stale, expected,
        "a doctored row must differ from the generated page"
    );
    assert_eq!(
        with_region(&page, "errors", &region("errors", ERROR_RS, &table)).expect("region"),
        page
    );
    let mut files = test_files();
    files.insert("tests/planted.rs".into(), "use std::fs;\n".into());
    rejected(
        "a test file without a header",
        parse_test_files(&files),
        "tests/planted.rs: no //! header",
    );
}

#[test]
fn error_formats_read_as_their_documented_reply() {
    assert!(matches_reply(
        "STALE fencing token <fence> is older than <highest>",
        "STALE fencing token {fence} is older than {highest}"
    ));
    assert!(matches_reply(
        "ERR LIMIT does not match this lease's limit <m|none>",
        "ERR LIMIT does not match this lease's limit none"
    ));
    assert!(!matches_reply(
        "ERR LIMIT does not match this lease's limit <m|none>",
        "ERR LIMIT does not match the limit {n}"
    ));
    assert!(!matches_reply(
        "STALE fencing token <fence> is older than <highest>",
        "STALE fencing token {fence} is newer than {highest}"
    ));
    assert!(matches_reply("ERR fixed", "ERR fixed"));
    assert!(!matches_reply("ERR fixed", "ERR fixed too"));
}
