//! `effect`: the forms of `LEASE.APPLY` (model/src/effect.rs) decoded from
//! arbitrary arguments. Every effect that decodes encodes to arguments that
//! decode to the same effect, and those arguments encode again unchanged:
//! what a replica reads is what the primary meant, and one encoding each.

use crate::model::effect::Effect;

/// Input: the arguments after the key, separated by NUL bytes.
pub fn fuzz_effect(data: &[u8]) {
    let parts: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    let Ok(effect) = Effect::decode(&parts) else {
        return;
    };
    let args = effect.to_args();
    let again: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let decoded = Effect::decode(&again)
        .unwrap_or_else(|e| panic!("{effect:?} encodes to {args:?}, refused: {e:?}"));
    assert_eq!(decoded, effect, "{args:?}");
    assert_eq!(decoded.to_args(), args);
}
