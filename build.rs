//! Generates, from `commands/*.json` (one file per command, in Redis's own
//! command JSON format: redis/redis `src/commands/*.json`):
//!
//! - `$OUT_DIR/commands.rs`: the registration table `COMMANDS`, included by
//!   `src/commands/registry.rs` (flags, arity, key specs, ACL categories and
//!   what `COMMAND DOCS` shows: summary, complexity, since, history,
//!   arguments). The handler stays bound in Rust: each entry asks
//!   `registry.rs`'s `handler` for its command, and a name it does not know
//!   fails the build.
//! - `$OUT_DIR/commands.md`: docs/src/reference/commands.md, which `tests/command_docs.rs`
//!   compares with the committed file (and rewrites with
//!   `LEASE_UPDATE_DOCS=1`).
//! - `$OUT_DIR/command_docs.rs`: what `COMMAND DOCS` must show for each
//!   command, for `tests/command_docs.rs`.
//!
//! A malformed file, an unknown field or value, or a missing required field
//! fails the build with the file's name and what is wrong. Offline, and only
//! rerun when `commands/` or this file changes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// One command, as in redis/redis `src/commands/*.json`. Fields of that
/// format the module API has no place for (`function`, `container`,
/// `deprecated_since`, `replaced_by`) are refused rather than ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandJson {
    summary: String,
    complexity: String,
    group: String,
    since: String,
    arity: i32,
    /// Present when the handler answers `COMMAND GETKEYS` itself: the
    /// `getkeys-api` flag. (Named for the format; here it documents which
    /// Rust function does it.)
    get_keys_function: Option<String>,
    command_flags: Vec<String>,
    acl_categories: Vec<String>,
    key_specs: Vec<KeySpecJson>,
    reply_schema: Json,
    arguments: Vec<ArgJson>,
    #[serde(default)]
    history: Vec<(String, String)>,
    #[serde(default)]
    command_tips: Vec<String>,
    /// `SYSCMD` (not for clients) or `DEPRECATED`: the docs only; the
    /// module API has no doc flags.
    #[serde(default)]
    doc_flags: Vec<String>,
}

/// A JSON value that keeps an object's members in the file's order, as
/// the docs show them (serde_json's `Value` sorts them unless its
/// `preserve_order` feature adds three more crates to the build).
enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct JsonVisitor;
        impl<'de> Visitor<'de> for JsonVisitor {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
                Ok(Json::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
                Ok(Json::Number(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
                Ok(Json::Number(v.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(v)
                    .map(Json::Number)
                    .ok_or_else(|| E::custom("not a finite number"))
            }
            fn visit_str<E>(self, v: &str) -> Result<Json, E> {
                Ok(Json::String(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Json::Object(members))
            }
        }
        d.deserialize_any(JsonVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeySpecJson {
    notes: Option<String>,
    flags: Vec<String>,
    begin_search: BeginSearchJson,
    find_keys: FindKeysJson,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum BeginSearchJson {
    Index { pos: i32 },
    Keyword { keyword: String, startfrom: i32 },
    Unknown,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum FindKeysJson {
    Range {
        lastkey: i32,
        step: i32,
        limit: i32,
    },
    Keynum {
        keynumidx: i32,
        firstkey: i32,
        step: i32,
    },
    Unknown,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum ArgType {
    String,
    Integer,
    Double,
    Key,
    Pattern,
    UnixTime,
    PureToken,
    Oneof,
    Block,
}

impl ArgType {
    /// The name `COMMAND DOCS` and the JSON use.
    fn name(self) -> &'static str {
        match self {
            ArgType::String => "string",
            ArgType::Integer => "integer",
            ArgType::Double => "double",
            ArgType::Key => "key",
            ArgType::Pattern => "pattern",
            ArgType::UnixTime => "unix-time",
            ArgType::PureToken => "pure-token",
            ArgType::Oneof => "oneof",
            ArgType::Block => "block",
        }
    }

    fn raw(self) -> String {
        let suffix = self.name().to_ascii_uppercase().replace('-', "_");
        format!("raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_{suffix}")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArgJson {
    name: String,
    #[serde(rename = "type")]
    kind: ArgType,
    key_spec_index: Option<i32>,
    token: Option<String>,
    summary: Option<String>,
    since: Option<String>,
    deprecated_since: Option<String>,
    display: Option<String>,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    multiple: bool,
    #[serde(default)]
    multiple_token: bool,
    #[serde(default)]
    arguments: Vec<ArgJson>,
}

impl ArgJson {
    fn flags(&self) -> Vec<&'static str> {
        let mut flags = Vec::new();
        if self.optional {
            flags.push("optional");
        }
        if self.multiple {
            flags.push("multiple");
        }
        if self.multiple_token {
            flags.push("multiple_token");
        }
        flags
    }
}

/// A command read from its file and checked.
struct Command {
    /// `lease.acquire`: the name the module registers.
    name: String,
    file: String,
    json: CommandJson,
}

/// The JSON's command flags and the module API's names for them
/// (`RedisModule_CreateCommand`).
const COMMAND_FLAGS: &[(&str, &str)] = &[
    ("WRITE", "write"),
    ("READONLY", "readonly"),
    ("ADMIN", "admin"),
    ("DENYOOM", "deny-oom"),
    ("NOSCRIPT", "deny-script"),
    ("LOADING", "allow-loading"),
    ("PUBSUB", "pubsub"),
    ("BLOCKING", "blocking"),
    ("STALE", "allow-stale"),
    ("SKIP_MONITOR", "no-monitor"),
    ("SKIP_SLOWLOG", "no-slowlog"),
    ("FAST", "fast"),
    ("NO_AUTH", "no-auth"),
    ("MAY_REPLICATE", "may-replicate"),
    ("NO_MANDATORY_KEYS", "no-mandatory-keys"),
    ("ALLOW_BUSY", "allow-busy"),
    ("INTERNAL", "internal"),
];

/// Flags older servers refuse at `RedisModule_CreateCommand` (Redis 8 added
/// `internal`): the command is registered without them there.
const NEWER_FLAGS: &[&str] = &["internal"];

const KEY_FLAGS: &[&str] = &[
    "RO",
    "RW",
    "OW",
    "RM",
    "ACCESS",
    "UPDATE",
    "INSERT",
    "DELETE",
    "NOT_KEY",
    "INCOMPLETE",
    "VARIABLE_FLAGS",
];

const ACL_CATEGORIES: &[&str] = &[
    "KEYSPACE",
    "READ",
    "WRITE",
    "SET",
    "SORTEDSET",
    "LIST",
    "HASH",
    "STRING",
    "BITMAP",
    "HYPERLOGLOG",
    "GEO",
    "STREAM",
    "PUBSUB",
    "ADMIN",
    "FAST",
    "SLOW",
    "BLOCKING",
    "DANGEROUS",
    "CONNECTION",
    "TRANSACTION",
    "SCRIPTING",
];

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dir = root.join("commands");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=commands");

    let commands = match read_commands(&dir) {
        Ok(commands) => commands,
        Err(e) => fail(&e),
    };
    write(&out.join("commands.rs"), &registration_table(&commands));
    write(&out.join("commands.md"), &markdown(&commands));
    write(&out.join("command_docs.rs"), &expected_docs(&commands));
}

fn fail(message: &str) -> ! {
    // Cargo prints a failed build script's stderr.
    eprintln!("error: {message}");
    std::process::exit(1);
}

fn write(path: &Path, contents: &str) {
    if let Err(e) = fs::write(path, contents) {
        fail(&format!("cannot write {}: {e}", path.display()));
    }
}

fn read_commands(dir: &Path) -> Result<Vec<Command>, String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(format!("no command descriptions in {}", dir.display()));
    }
    let mut commands = Vec::new();
    for path in paths {
        let file = format!(
            "commands/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        let command = read_command(&path, &file).map_err(|e| format!("{file}: {e}"))?;
        commands.push(command);
    }
    Ok(commands)
}

fn read_command(path: &Path, file: &str) -> Result<Command, String> {
    let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut top: BTreeMap<String, CommandJson> =
        serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if top.len() != 1 {
        return Err("must hold exactly one command: { \"NAME\": { ... } }".into());
    }
    let (upper, json) = top.pop_first().ok_or("no command")?;
    let name = upper.to_ascii_lowercase();
    if upper != name.to_ascii_uppercase() {
        return Err(format!("the command name {upper:?} must be upper case"));
    }
    if file != format!("commands/{name}.json") {
        return Err(format!(
            "describes {upper}: the file must be named {name}.json"
        ));
    }
    check(&json).map_err(|e| format!("{upper}: {e}"))?;
    Ok(Command {
        name,
        file: file.to_string(),
        json,
    })
}

fn check(c: &CommandJson) -> Result<(), String> {
    if c.group != "module" {
        return Err(format!(
            "group {:?}: a module's commands are in the group \"module\"",
            c.group
        ));
    }
    for (field, value) in [
        ("summary", &c.summary),
        ("complexity", &c.complexity),
        ("since", &c.since),
    ] {
        text(field, value)?;
    }
    if c.arity == 0 {
        return Err("arity must not be 0".into());
    }
    for flag in &c.command_flags {
        if !COMMAND_FLAGS.iter().any(|(json, _)| json == flag) {
            let known: Vec<&str> = COMMAND_FLAGS.iter().map(|(json, _)| *json).collect();
            return Err(format!(
                "command_flags: unknown flag {flag:?} (known: {})",
                known.join(", ")
            ));
        }
    }
    if c.acl_categories.is_empty() {
        // Module commands get exactly the categories set, none implied
        // by their flags.
        return Err("acl_categories: name every category (write/read, fast/slow, ...)".into());
    }
    for category in &c.acl_categories {
        if !ACL_CATEGORIES.contains(&category.as_str()) {
            return Err(format!("acl_categories: unknown category {category:?}"));
        }
    }
    // A command may have no key (LEASE.DEBUG); one with a key argument has
    // its key spec (checked with the arguments below).
    for (i, spec) in c.key_specs.iter().enumerate() {
        check_key_spec(spec).map_err(|e| format!("key_specs[{i}]: {e}"))?;
    }
    if let Some(function) = &c.get_keys_function {
        text("get_keys_function", function)?;
    }
    let mut used = BTreeSet::new();
    check_args(&c.arguments, c.key_specs.len(), &mut used, "arguments")?;
    for (i, spec) in c.key_specs.iter().enumerate() {
        // An incomplete spec (keys found by the getkeys callback) has no
        // argument of its own.
        if !used.contains(&i) && !spec.flags.iter().any(|f| f == "INCOMPLETE") {
            return Err(format!("key_specs[{i}] is used by no key argument"));
        }
    }
    for (i, (since, changes)) in c.history.iter().enumerate() {
        text(&format!("history[{i}] version"), since)?;
        text(&format!("history[{i}] changes"), changes)?;
    }
    for tip in &c.command_tips {
        if tip.is_empty() || tip.contains(' ') {
            return Err(format!("command_tips: {tip:?} must be one word"));
        }
    }
    for flag in &c.doc_flags {
        if flag != "SYSCMD" && flag != "DEPRECATED" {
            return Err(format!(
                "doc_flags: unknown flag {flag:?} (SYSCMD, DEPRECATED)"
            ));
        }
    }
    check_schema(&c.reply_schema, "reply_schema")
}

/// A string the module hands to the server as a C string.
fn text(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.contains('\0') {
        return Err(format!("{field} must be a non-empty string without NUL"));
    }
    Ok(())
}

fn check_key_spec(spec: &KeySpecJson) -> Result<(), String> {
    for flag in &spec.flags {
        if !KEY_FLAGS.contains(&flag.as_str()) {
            return Err(format!(
                "unknown flag {flag:?} (known: {})",
                KEY_FLAGS.join(", ")
            ));
        }
    }
    let count = |group: &[&str]| {
        spec.flags
            .iter()
            .filter(|f| group.contains(&f.as_str()))
            .count()
    };
    if count(&["RO", "RW", "OW", "RM"]) != 1 {
        return Err("flags: exactly one of RO, RW, OW, RM".into());
    }
    if count(&["INSERT", "DELETE", "UPDATE"]) > 1 {
        return Err("flags: INSERT, DELETE and UPDATE exclude each other".into());
    }
    if let Some(notes) = &spec.notes {
        text("notes", notes)?;
    }
    if let BeginSearchJson::Keyword { keyword, .. } = &spec.begin_search {
        text("begin_search keyword", keyword)?;
    }
    Ok(())
}

fn check_args(
    args: &[ArgJson],
    key_specs: usize,
    used: &mut BTreeSet<usize>,
    path: &str,
) -> Result<(), String> {
    let mut names = BTreeSet::new();
    for arg in args {
        let here = format!("{path}.{}", arg.name);
        text(&format!("{path}: name"), &arg.name)?;
        if arg.name != arg.name.to_ascii_lowercase() || arg.name.contains('_') {
            return Err(format!("{here}: names are lower case, words joined by '-'"));
        }
        if !names.insert(arg.name.as_str()) {
            return Err(format!("{here}: two arguments of one name"));
        }
        match (arg.kind, arg.key_spec_index) {
            (ArgType::Key, Some(i)) if (0..key_specs as i32).contains(&i) => {
                used.insert(i as usize);
            }
            (ArgType::Key, _) => {
                return Err(format!(
                    "{here}: a key needs the key_spec_index of its key spec"
                ));
            }
            (_, Some(_)) => {
                return Err(format!("{here}: only a key has a key_spec_index"));
            }
            (_, None) => {}
        }
        if arg.kind == ArgType::PureToken && arg.token.is_none() {
            return Err(format!("{here}: a pure-token needs its token"));
        }
        let compound = matches!(arg.kind, ArgType::Oneof | ArgType::Block);
        if compound != (arg.arguments.len() >= 2) {
            return Err(format!(
                "{here}: oneof and block have at least two arguments, other types none"
            ));
        }
        if arg.multiple_token && !arg.multiple {
            return Err(format!("{here}: multiple_token needs multiple"));
        }
        for (field, value) in [
            ("token", &arg.token),
            ("summary", &arg.summary),
            ("since", &arg.since),
            ("deprecated_since", &arg.deprecated_since),
            ("display", &arg.display),
        ] {
            if let Some(value) = value {
                text(&format!("{here}: {field}"), value)?;
            }
        }
        check_args(&arg.arguments, key_specs, used, &here)?;
    }
    Ok(())
}

/// The rules redis/redis `utils/generate-command-code.py` holds reply
/// schemas to.
fn check_schema(schema: &Json, path: &str) -> Result<(), String> {
    let Json::Object(members) = schema else {
        return Err(format!("{path}: a schema is an object"));
    };
    let has = |key| schema.get(key).is_some();
    let kind = schema.get("type").and_then(Json::as_str);
    if kind == Some("object") && has("properties") && !has("additionalProperties") {
        return Err(format!(
            "{path}: an object with properties needs additionalProperties"
        ));
    }
    let item_list = schema.get("items").and_then(Json::as_array).is_some();
    if kind == Some("array") && item_list && !(has("minItems") && has("maxItems")) {
        return Err(format!(
            "{path}: an array with items needs minItems and maxItems"
        ));
    }
    for (key, value) in members {
        match value {
            Json::Object(properties) if key == "properties" || key == "patternProperties" => {
                for (name, property) in properties {
                    check_schema(property, &format!("{path}.{key}.{name}"))?;
                }
            }
            Json::Object(_) => check_schema(value, &format!("{path}.{key}"))?,
            Json::Array(items) if key != "enum" && key != "required" => {
                for (i, item) in items.iter().enumerate() {
                    check_schema(item, &format!("{path}.{key}[{i}]"))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The registration table
// ---------------------------------------------------------------------------

/// A C string literal.
fn c(s: &str) -> String {
    format!("c{s:?}")
}

fn c_opt(s: &Option<String>) -> String {
    match s {
        Some(s) => format!("Some({})", c(s)),
        None => "None".into(),
    }
}

fn module_flags(c: &CommandJson, newer: bool) -> String {
    let mut flags: Vec<&str> = c
        .command_flags
        .iter()
        .filter_map(|f| COMMAND_FLAGS.iter().find(|(json, _)| json == f))
        .map(|(_, module)| *module)
        .filter(|f| newer || !NEWER_FLAGS.contains(f))
        .collect();
    if c.get_keys_function.is_some() {
        flags.push("getkeys-api");
    }
    flags.join(" ")
}

/// `RedisModule_CreateCommand`'s first, last and step keys: those of the
/// first key spec when it is a plain range (servers with key specs
/// recompute them anyway).
fn legacy_range(specs: &[KeySpecJson]) -> (i32, i32, i32) {
    match specs.first() {
        Some(KeySpecJson {
            begin_search: BeginSearchJson::Index { pos },
            find_keys: FindKeysJson::Range { lastkey, step, .. },
            ..
        }) => {
            let last = if *lastkey >= 0 {
                pos + lastkey
            } else {
                *lastkey
            };
            (*pos, last, *step)
        }
        _ => (0, 0, 0),
    }
}

fn registration_table(commands: &[Command]) -> String {
    let mut s = String::from(
        "// Generated by build.rs from commands/*.json: edit those, not this.\n\n\
         static COMMANDS: &[Command] = &[\n",
    );
    for command in commands {
        let j = &command.json;
        let upper = command.name.to_ascii_uppercase();
        let flags = module_flags(j, true);
        let fallback = module_flags(j, false);
        let (first, last, step) = legacy_range(&j.key_specs);
        let acl: Vec<String> = j
            .acl_categories
            .iter()
            .map(|a| a.to_ascii_lowercase())
            .collect();
        let _ = writeln!(s, "    Command {{");
        let _ = writeln!(s, "        name: {},", c(&command.name));
        let _ = writeln!(
            s,
            "        handler: match handler(b{:?}) {{\n            Some(h) => h,\n            None => panic!({:?}),\n        }},",
            command.name,
            format!(
                "{}: {upper} has no handler: add it to `handler` in src/commands/registry.rs",
                command.file
            )
        );
        let _ = writeln!(s, "        flags: {},", c(&flags));
        let _ = writeln!(
            s,
            "        fallback_flags: {},",
            if fallback == flags {
                "None".into()
            } else {
                format!("Some({})", c(&fallback))
            }
        );
        let _ = writeln!(s, "        arity: {},", j.arity);
        let _ = writeln!(
            s,
            "        first_key: {first},\n        last_key: {last},\n        key_step: {step},"
        );
        let _ = writeln!(s, "        key_specs: &[");
        for spec in &j.key_specs {
            let key_flags: Vec<String> = spec
                .flags
                .iter()
                .map(|f| format!("raw::REDISMODULE_CMD_KEY_{f}"))
                .collect();
            let begin = match &spec.begin_search {
                BeginSearchJson::Index { pos } => format!("BeginSearch::Index({pos})"),
                BeginSearchJson::Keyword { keyword, startfrom } => {
                    format!("BeginSearch::Keyword({}, {startfrom})", c(keyword))
                }
                BeginSearchJson::Unknown => "BeginSearch::Unknown".into(),
            };
            let find = match &spec.find_keys {
                FindKeysJson::Range {
                    lastkey,
                    step,
                    limit,
                } => format!("FindKeys::Range {{ last_key: {lastkey}, step: {step}, limit: {limit} }}"),
                FindKeysJson::Keynum {
                    keynumidx,
                    firstkey,
                    step,
                } => format!(
                    "FindKeys::KeyNum {{ key_num_index: {keynumidx}, first_key: {firstkey}, step: {step} }}"
                ),
                FindKeysJson::Unknown => "FindKeys::Unknown".into(),
            };
            let _ = writeln!(
                s,
                "            KeySpec {{\n                notes: {},\n                flags: {},\n                begin_search: {begin},\n                find_keys: {find},\n            }},",
                c_opt(&spec.notes),
                key_flags.join(" | ")
            );
        }
        let _ = writeln!(s, "        ],");
        let _ = writeln!(s, "        acl_categories: {:?},", acl.join(" "));
        let _ = writeln!(s, "        summary: {},", c(&j.summary));
        let _ = writeln!(s, "        complexity: {},", c(&j.complexity));
        let _ = writeln!(s, "        since: {},", c(&j.since));
        let history: Vec<String> = j
            .history
            .iter()
            .map(|(since, changes)| format!("({}, {})", c(since), c(changes)))
            .collect();
        let _ = writeln!(s, "        history: &[{}],", history.join(", "));
        let tips =
            (!j.command_tips.is_empty()).then(|| j.command_tips.join(" ").to_ascii_lowercase());
        let _ = writeln!(s, "        tips: {},", c_opt(&tips));
        let _ = writeln!(s, "        args: {},", args_table(&j.arguments, 2));
        let _ = writeln!(s, "    }},");
    }
    s.push_str("];\n");
    s
}

fn args_table(args: &[ArgJson], depth: usize) -> String {
    if args.is_empty() {
        return "&[]".into();
    }
    let pad = "    ".repeat(depth + 1);
    let mut s = String::from("&[\n");
    for arg in args {
        let flags: Vec<String> = arg
            .flags()
            .iter()
            .map(|f| format!("raw::REDISMODULE_CMD_ARG_{}", f.to_ascii_uppercase()))
            .collect();
        let _ = write!(
            s,
            "{pad}Arg {{\n\
             {pad}    name: {},\n\
             {pad}    kind: {},\n\
             {pad}    key_spec_index: {},\n\
             {pad}    token: {},\n\
             {pad}    summary: {},\n\
             {pad}    since: {},\n\
             {pad}    deprecated_since: {},\n\
             {pad}    display_text: {},\n\
             {pad}    flags: {},\n\
             {pad}    subargs: {},\n\
             {pad}}},\n",
            c(&arg.name),
            arg.kind.raw(),
            arg.key_spec_index.unwrap_or(-1),
            c_opt(&arg.token.as_ref().map(|t| t.to_ascii_uppercase())),
            c_opt(&arg.summary),
            c_opt(&arg.since),
            c_opt(&arg.deprecated_since),
            c_opt(&arg.display.as_ref().map(|d| d.to_ascii_lowercase())),
            if flags.is_empty() {
                "0".into()
            } else {
                flags.join(" | ")
            },
            args_table(&arg.arguments, depth + 2),
        );
    }
    let _ = write!(s, "{}]", "    ".repeat(depth));
    s
}

// ---------------------------------------------------------------------------
// What COMMAND DOCS must show (tests/command_docs.rs)
// ---------------------------------------------------------------------------

fn expected_docs(commands: &[Command]) -> String {
    let mut s = String::from("// Generated by build.rs from commands/*.json.\n&[\n");
    for command in commands {
        let j = &command.json;
        let history: Vec<String> = j
            .history
            .iter()
            .map(|(since, changes)| format!("({since:?}, {changes:?})"))
            .collect();
        let _ = writeln!(
            s,
            "    DocCommand {{ name: {:?}, summary: {:?}, complexity: {:?}, since: {:?}, history: &[{}], arguments: {} }},",
            command.name,
            j.summary,
            j.complexity,
            j.since,
            history.join(", "),
            expected_args(&j.arguments)
        );
    }
    s.push_str("]\n");
    s
}

fn expected_args(args: &[ArgJson]) -> String {
    let items: Vec<String> = args
        .iter()
        .map(|a| {
            format!(
                "DocArg {{ name: {:?}, kind: {:?}, key_spec_index: {:?}, token: {:?}, summary: {:?}, display: {:?}, flags: &{:?}, arguments: {} }}",
                a.name,
                a.kind.name(),
                a.key_spec_index,
                a.token.as_ref().map(|t| t.to_ascii_uppercase()),
                a.summary,
                a.display.as_ref().map(|d| d.to_ascii_lowercase()),
                a.flags(),
                expected_args(&a.arguments)
            )
        })
        .collect();
    format!("&[{}]", items.join(", "))
}

// ---------------------------------------------------------------------------
// docs/src/reference/commands.md
// ---------------------------------------------------------------------------

/// A JSON file's prose as Markdown text: a `<placeholder>` outside a code span
/// (`STALE fencing token <fence> ...`) would otherwise read as an HTML tag and vanish
/// from the page. Inside a code span it stays as it is (an entity would show there).
fn md_text(prose: &str) -> String {
    let mut out = String::with_capacity(prose.len());
    let mut in_code = false;
    for c in prose.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

fn is_internal(c: &Command) -> bool {
    c.json.doc_flags.iter().any(|f| f == "SYSCMD")
}

fn markdown(commands: &[Command]) -> String {
    // Client commands first, the internal ones after, each by name.
    let mut ordered: Vec<&Command> = commands.iter().collect();
    ordered.sort_by_key(|c| (is_internal(c), c.name.clone()));

    let mut s = String::from(
        "<!-- Generated by build.rs from commands/*.json: edit those, then run\n     \
         LEASE_UPDATE_DOCS=1 cargo test --release --test command_docs docs_commands_md -->\n\n\
         # Command reference\n\n\
         Each command is described once, in Redis's command JSON format, in\n\
         [`commands/`](../../../commands). The module's registration (what `COMMAND INFO`\n\
         and `COMMAND DOCS` show) and this page are generated from those files by\n\
         `build.rs`. All durations are integer milliseconds; every error reply is in\n\
         [Errors](errors.md).\n\n\
         | Command | Summary |\n|---|---|\n",
    );
    for c in &ordered {
        let upper = c.name.to_ascii_uppercase();
        let _ = writeln!(
            s,
            "| [`{upper}`](#{}) | {} |",
            c.name.replace('.', ""),
            md_text(&c.json.summary)
        );
    }
    for c in &ordered {
        command_markdown(&mut s, c);
    }
    s
}

fn command_markdown(s: &mut String, c: &Command) {
    let j = &c.json;
    let upper = c.name.to_ascii_uppercase();
    let mut usage = upper.clone();
    for arg in &j.arguments {
        usage.push(' ');
        usage.push_str(&syntax(arg));
    }
    let _ = write!(
        s,
        "\n## {upper}\n\n```\n{usage}\n```\n\n{}\n\n",
        md_text(&j.summary)
    );
    if is_internal(c) {
        s.push_str("Internal: not for clients (doc flag `SYSCMD`).\n\n");
    }
    if j.doc_flags.iter().any(|f| f == "DEPRECATED") {
        s.push_str("Deprecated.\n\n");
    }
    let _ = writeln!(s, "- **Complexity:** {}", j.complexity);
    let _ = writeln!(s, "- **Since:** {}", j.since);
    let flags: Vec<String> = j
        .command_flags
        .iter()
        .map(|f| {
            let name = format!("`{}`", f.to_ascii_lowercase());
            if NEWER_FLAGS.contains(&f.to_ascii_lowercase().as_str()) {
                format!("{name} (on servers that have it)")
            } else {
                name
            }
        })
        .chain(
            j.get_keys_function
                .iter()
                .map(|_| "`getkeys-api`".to_string()),
        )
        .collect();
    let _ = writeln!(s, "- **Flags:** {}", flags.join(", "));
    let acl: Vec<String> = j
        .acl_categories
        .iter()
        .map(|a| format!("`@{}`", a.to_ascii_lowercase()))
        .collect();
    let lease_category = if j.command_flags.iter().any(|f| f == "ADMIN") {
        " (an admin command is not in `@lease`, which lock clients are given)"
    } else {
        ", and `@lease` where the server has module ACL categories"
    };
    let _ = writeln!(
        s,
        "- **ACL categories:** {}{lease_category}",
        acl.join(", ")
    );
    for (i, spec) in j.key_specs.iter().enumerate() {
        let _ = writeln!(s, "- **Key spec {i}:** {}", key_spec_text(spec));
    }
    if !j.command_tips.is_empty() {
        let _ = writeln!(
            s,
            "- **Tips:** {}",
            j.command_tips.join(", ").to_ascii_lowercase()
        );
    }
    s.push_str("\n### Arguments\n\n");
    for arg in &j.arguments {
        arg_markdown(s, arg, 0);
    }
    s.push_str("\n### Reply\n\n");
    reply_markdown(s, &j.reply_schema, 0);
    if !j.history.is_empty() {
        s.push_str("\n### History\n\n");
        for (since, changes) in &j.history {
            let _ = writeln!(s, "- {since}: {}", md_text(changes));
        }
    }
}

fn key_spec_text(spec: &KeySpecJson) -> String {
    let which = match (&spec.begin_search, &spec.find_keys) {
        (BeginSearchJson::Index { pos }, FindKeysJson::Range { lastkey: 0, .. }) => {
            format!("argument {pos}")
        }
        (
            BeginSearchJson::Index { pos },
            FindKeysJson::Range {
                lastkey: -1, step, ..
            },
        ) => {
            let every = if *step == 1 {
                String::new()
            } else {
                format!(", every {step}")
            };
            format!("arguments {pos} to the last{every}")
        }
        (BeginSearchJson::Index { pos }, FindKeysJson::Range { lastkey, step, .. }) => {
            format!("from argument {pos}, last key {lastkey}, step {step}")
        }
        (BeginSearchJson::Keyword { keyword, startfrom }, _) => {
            format!("after `{keyword}` (searched from {startfrom})")
        }
        _ => "found by the command".into(),
    };
    let mut text = format!("{which}, {}", spec.flags.join(" "));
    if spec.flags.iter().any(|f| f == "INCOMPLETE") {
        text.push_str(" (each key is reported by `COMMAND GETKEYS`)");
    }
    if let Some(notes) = &spec.notes {
        let _ = write!(text, ". {notes}");
    }
    text
}

/// An argument as Redis's docs show it: `[TOKEN token]`, `key [key ...]`,
/// `<a | b>`.
fn syntax(arg: &ArgJson) -> String {
    let token = arg.token.as_ref().map(|t| t.to_ascii_uppercase());
    let value = || arg.display.clone().unwrap_or_else(|| arg.name.clone());
    let mut s = match arg.kind {
        ArgType::PureToken => token.clone().unwrap_or_default(),
        ArgType::Oneof => {
            let alternatives: Vec<String> = arg.arguments.iter().map(syntax).collect();
            let joined = alternatives.join(" | ");
            if arg.optional {
                joined
            } else {
                format!("<{joined}>")
            }
        }
        ArgType::Block => arg
            .arguments
            .iter()
            .map(syntax)
            .collect::<Vec<_>>()
            .join(" "),
        _ => value(),
    };
    if arg.kind != ArgType::PureToken {
        if let Some(token) = &token {
            s = format!("{token} {s}");
        }
    }
    if arg.multiple {
        let again = if arg.multiple_token || token.is_none() {
            s.clone()
        } else {
            value()
        };
        s = format!("{s} [{again} ...]");
    }
    if arg.optional {
        s = format!("[{s}]");
    }
    s
}

fn arg_markdown(s: &mut String, arg: &ArgJson, depth: usize) {
    let pad = "  ".repeat(depth);
    let mut what = vec![arg.kind.name().to_string()];
    what.extend(arg.flags().iter().map(|f| f.replace('_', " ")));
    if let Some(since) = &arg.since {
        what.push(format!("since {since}"));
    }
    if let Some(deprecated) = &arg.deprecated_since {
        what.push(format!("deprecated since {deprecated}"));
    }
    let shown = match arg.kind {
        ArgType::Oneof | ArgType::Block => format!("`{}`", arg.name),
        _ => format!("`{}`", syntax_bare(arg)),
    };
    let _ = write!(s, "{pad}- {shown} ({})", what.join(", "));
    if let Some(summary) = &arg.summary {
        let _ = write!(s, ": {}", md_text(summary));
    }
    s.push('\n');
    for sub in &arg.arguments {
        arg_markdown(s, sub, depth + 1);
    }
}

/// An argument's syntax without the brackets of optional or repeated.
fn syntax_bare(arg: &ArgJson) -> String {
    let token = arg.token.as_ref().map(|t| t.to_ascii_uppercase());
    let value = arg.display.clone().unwrap_or_else(|| arg.name.clone());
    match (arg.kind, token) {
        (ArgType::PureToken, Some(token)) => token,
        (_, Some(token)) => format!("{token} {value}"),
        (_, None) => value,
    }
}

fn alternatives(schema: &Json) -> Option<&[Json]> {
    schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Json::as_array)
}

/// `"a"` or `"b"`: a choice of constants with nothing to say about each.
fn is_const_choice(schema: &Json) -> bool {
    alternatives(schema).is_some_and(|choices| {
        choices
            .iter()
            .all(|c| c.get("const").is_some() && c.get("description").is_none())
    })
}

fn reply_markdown(s: &mut String, schema: &Json, depth: usize) {
    match alternatives(schema) {
        Some(choices) if !is_const_choice(schema) => {
            for choice in choices {
                reply_item(s, choice, depth, "- ");
            }
        }
        _ => reply_item(s, schema, depth, "- "),
    }
}

fn reply_item(s: &mut String, schema: &Json, depth: usize, bullet: &str) {
    let pad = "  ".repeat(depth);
    let _ = write!(s, "{pad}{bullet}{}", reply_label(schema));
    if let Some(description) = schema.get("description").and_then(Json::as_str) {
        let _ = write!(s, ": {}", md_text(description));
    }
    s.push('\n');
    match schema.get("items") {
        Some(Json::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                reply_item(s, item, depth + 1, &format!("{}. ", i + 1));
            }
        }
        Some(item) => reply_item(s, item, depth + 1, "- each: "),
        None => {}
    }
    if let Some(Json::Object(properties)) = schema.get("properties") {
        for (name, property) in properties {
            reply_item(s, property, depth + 1, &format!("- `{name}`: "));
        }
    }
}

fn reply_label(schema: &Json) -> String {
    match schema.get("const") {
        Some(Json::String(v)) => return format!("`{v}`"),
        Some(Json::Number(v)) => return format!("`{v}`"),
        Some(Json::Bool(v)) => return format!("`{v}`"),
        _ => {}
    }
    if is_const_choice(schema) {
        let choices: Vec<String> = alternatives(schema)
            .unwrap_or_default()
            .iter()
            .map(reply_label)
            .collect();
        return choices.join(" or ");
    }
    let count = |key| match schema.get(key) {
        Some(Json::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let items = match (count("minItems"), count("maxItems")) {
        (Some(min), Some(max)) if min == max => format!(" of {min}"),
        _ => String::new(),
    };
    match schema.get("type").and_then(Json::as_str) {
        Some("null") => "nil".into(),
        Some("integer") => "integer".into(),
        Some("number") => "double".into(),
        Some("string") => "string".into(),
        Some("boolean") => "boolean".into(),
        Some("array") => format!("array{items}"),
        Some("object") => "map".into(),
        Some(other) => other.into(),
        None if alternatives(schema).is_some() => "one of".into(),
        None => "any reply".into(),
    }
}
