//! The attribute mask of Modify QP as Linux checks it. Programs written for libibverbs were
//! tested against the kernel's `ib_modify_qp_is_ok`, which every driver calls: per (current
//! state, next state, QP type) a set of required and a set of optional `IBV_QP_*` bits, and
//! any other bit refused. The C ABI answers the same (EINVAL), except where softhca keeps
//! the digest's answer on purpose ([`KEPT`], RULES.md Appendix B). The values themselves are
//! still checked by the core, whose tables (`transport/state.rs`) run after this one.

use std::ffi::c_int;

use softhca::{QpState, QpType};

use crate::abi::*;

/// The bits one transition requires and the bits it also takes, for one QP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub required: c_int,
    pub optional: c_int,
}

const fn r(required: c_int, optional: c_int) -> Rule {
    Rule { required, optional }
}

/// A transition that takes no attribute (to Reset, to Error, Reset → Reset).
const BARE: Rule = r(0, 0);

/// One row of the kernel's `qp_state_table`: a transition Linux allows, with its rules for
/// RC, UC, UD and Raw Packet, in the order of [`column()`].
struct Transition {
    from: QpState,
    to: QpState,
    rules: [Rule; 4],
}

use QpState as S;

const fn t(from: QpState, to: QpState, rules: [Rule; 4]) -> Transition {
    Transition { from, to, rules }
}

const fn same(rule: Rule) -> [Rule; 4] {
    [rule, rule, rule, rule]
}

/// RC, UC and UD as given; a Raw Packet QP takes nothing (it has the port at Reset → Init and
/// Init → Init only, MOD-RAW-1).
const fn connected(rc: Rule, uc: Rule, ud: Rule) -> [Rule; 4] {
    [rc, uc, ud, BARE]
}

const CUR: c_int = IBV_QP_CUR_STATE;
const ACCESS: c_int = IBV_QP_ACCESS_FLAGS;
const PKEY: c_int = IBV_QP_PKEY_INDEX;
const ALT: c_int = IBV_QP_ALT_PATH;
const MIG: c_int = IBV_QP_PATH_MIG_STATE;
const RNR_TIMER: c_int = IBV_QP_MIN_RNR_TIMER;
/// The primary path of a connected QP at Init → RTR (Linux requires the MTU with it).
const PATH: c_int = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
const RC_SEND: c_int = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

/// What Linux takes at SQD → SQD, per type: the attributes a drained QP may retune.
const RC_SQD_SQD: c_int = IBV_QP_PORT
    | IBV_QP_AV
    | IBV_QP_TIMEOUT
    | IBV_QP_RETRY_CNT
    | IBV_QP_RNR_RETRY
    | IBV_QP_MAX_QP_RD_ATOMIC
    | IBV_QP_MAX_DEST_RD_ATOMIC
    | ALT
    | ACCESS
    | PKEY
    | RNR_TIMER
    | MIG;
const UC_SQD_SQD: c_int = IBV_QP_AV | ALT | ACCESS | PKEY | MIG;
const UD_SQD_SQD: c_int = PKEY | IBV_QP_QKEY;

/// What an XRC QP's side lacks of RC's attributes: an initiator's responder attributes, a
/// target's requester attributes beyond its Local ACK Timeout and SQ PSN. The kernel's
/// `qp_state_table` columns for `IB_QPT_XRC_INI` and `IB_QPT_XRC_TGT` are RC's less these
/// (see [`rule`]), and uverbs takes them out of an XRC QP's Modify QP before the table sees it
/// (`modify_qp_mask`, see [`applicable`]).
fn xrc_lacks(qp_type: QpType) -> c_int {
    match qp_type {
        QpType::XrcSend => IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
        QpType::XrcRecv => IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY,
        _ => 0,
    }
}

/// What uverbs takes out of an XRC QP's Modify QP before the table sees it (`modify_qp_mask`):
/// the attributes of the side the QP lacks, which programs such as perftest pass to both.
pub fn applicable(qp_type: QpType, mask: c_int) -> c_int {
    mask & !xrc_lacks(qp_type)
}

/// The kernel's `qp_state_table` (drivers/infiniband/core/verbs.c) for RC, UC and UD; a
/// (from, to) pair that is not here is refused. Linux has no row for Reset → Error.
const LINUX: &[Transition] = &[
    t(S::Reset, S::Reset, same(BARE)),
    t(
        S::Reset,
        S::Init,
        [
            r(PKEY | IBV_QP_PORT | ACCESS, 0),
            r(PKEY | IBV_QP_PORT | ACCESS, 0),
            r(PKEY | IBV_QP_PORT | IBV_QP_QKEY, 0),
            r(IBV_QP_PORT, 0),
        ],
    ),
    t(S::Init, S::Reset, same(BARE)),
    t(S::Init, S::Error, same(BARE)),
    t(
        S::Init,
        S::Init,
        [
            r(0, PKEY | IBV_QP_PORT | ACCESS),
            r(0, PKEY | IBV_QP_PORT | ACCESS),
            r(0, PKEY | IBV_QP_PORT | IBV_QP_QKEY),
            r(0, IBV_QP_PORT),
        ],
    ),
    t(
        S::Init,
        S::Rtr,
        connected(
            r(PATH | IBV_QP_MAX_DEST_RD_ATOMIC | RNR_TIMER, ALT | ACCESS | PKEY),
            r(PATH, ALT | ACCESS | PKEY),
            r(0, PKEY | IBV_QP_QKEY),
        ),
    ),
    t(S::Rtr, S::Reset, same(BARE)),
    t(S::Rtr, S::Error, same(BARE)),
    t(
        S::Rtr,
        S::Rts,
        connected(
            r(RC_SEND, CUR | ALT | ACCESS | RNR_TIMER | MIG),
            r(IBV_QP_SQ_PSN, CUR | ALT | ACCESS | MIG),
            r(IBV_QP_SQ_PSN, CUR | IBV_QP_QKEY),
        ),
    ),
    t(S::Rts, S::Reset, same(BARE)),
    t(S::Rts, S::Error, same(BARE)),
    t(
        S::Rts,
        S::Rts,
        connected(r(0, CUR | ACCESS | ALT | MIG | RNR_TIMER), r(0, CUR | ACCESS | ALT | MIG), r(0, CUR | IBV_QP_QKEY)),
    ),
    t(
        S::Rts,
        S::Sqd,
        connected(r(0, IBV_QP_EN_SQD_ASYNC_NOTIFY), r(0, IBV_QP_EN_SQD_ASYNC_NOTIFY), r(0, IBV_QP_EN_SQD_ASYNC_NOTIFY)),
    ),
    t(S::Sqd, S::Reset, same(BARE)),
    t(S::Sqd, S::Error, same(BARE)),
    t(
        S::Sqd,
        S::Rts,
        connected(r(0, CUR | ALT | ACCESS | RNR_TIMER | MIG), r(0, CUR | ALT | ACCESS | MIG), r(0, CUR | IBV_QP_QKEY)),
    ),
    t(S::Sqd, S::Sqd, connected(r(0, RC_SQD_SQD), r(0, UC_SQD_SQD), r(0, UD_SQD_SQD))),
    t(S::Sqe, S::Reset, same(BARE)),
    t(S::Sqe, S::Error, same(BARE)),
    // RC has no SQE (it goes to Error), so its column is empty in Linux too.
    t(S::Sqe, S::Rts, connected(BARE, r(0, CUR | ACCESS), r(0, CUR | IBV_QP_QKEY))),
    t(S::Error, S::Reset, same(BARE)),
    t(S::Error, S::Error, same(BARE)),
];

/// Where softhca keeps the digest's answer over Linux's (RULES.md Appendix B): the bits a
/// transition no longer requires (they become optional) and the bits it also takes. An entry
/// also makes its transition valid when Linux has no row for it.
pub struct Kept {
    pub from: QpState,
    pub to: QpState,
    pub qp_types: &'static [QpType],
    pub unrequire: c_int,
    pub allow: c_int,
    pub why: &'static str,
}

const ALL_TYPES: &[QpType] = &[QpType::Rc, QpType::Uc, QpType::Ud, QpType::RawEthertype];

pub const KEPT: &[Kept] = &[
    Kept {
        from: S::Reset,
        to: S::Error,
        qp_types: ALL_TYPES,
        unrequire: 0,
        allow: 0,
        why: "Reset -> Error is accepted (the digest: any state -> Error; Linux refuses it)",
    },
    Kept {
        from: S::Init,
        to: S::Rtr,
        qp_types: &[QpType::Rc],
        unrequire: RNR_TIMER,
        allow: 0,
        why: "RC Init -> RTR: IBV_QP_MIN_RNR_TIMER is optional (Linux requires it)",
    },
    Kept {
        from: S::Sqd,
        to: S::Rts,
        qp_types: &[QpType::Rc],
        unrequire: 0,
        allow: RC_SQD_SQD,
        why: "SQD -> RTS also takes what SQD -> SQD takes (Linux takes only a few there)",
    },
    Kept {
        from: S::Sqd,
        to: S::Rts,
        qp_types: &[QpType::Uc],
        unrequire: 0,
        allow: UC_SQD_SQD,
        why: "SQD -> RTS also takes what SQD -> SQD takes (Linux takes only a few there)",
    },
    Kept {
        from: S::Sqd,
        to: S::Rts,
        qp_types: &[QpType::Ud],
        unrequire: 0,
        allow: UD_SQD_SQD,
        why: "SQD -> RTS also takes what SQD -> SQD takes (Linux takes only a few there)",
    },
];

/// The column of `qp_type` in [`LINUX`]; the C ABI creates no other type (a Raw Packet QP is
/// a Raw Ethertype QP).
fn column(qp_type: QpType) -> Option<usize> {
    [QpType::Rc, QpType::Uc, QpType::Ud, QpType::RawEthertype].iter().position(|t| *t == qp_type)
}

/// The rule the C ABI applies to `from` → `to` for `qp_type`: Linux's, adjusted by [`KEPT`];
/// `None` for a transition neither allows. An XRC QP's is RC's less what its side lacks
/// ([`xrc_lacks`]), as the kernel's XRC columns are.
pub fn rule(qp_type: QpType, from: QpState, to: QpState) -> Option<Rule> {
    if qp_type.is_xrc() {
        let rc = rule(QpType::Rc, from, to)?;
        let lacks = xrc_lacks(qp_type);
        return Some(r(rc.required & !lacks, rc.optional & !lacks));
    }
    let col = column(qp_type)?;
    let linux = LINUX.iter().find(|x| x.from == from && x.to == to).map(|x| x.rules[col]);
    let mut kept = KEPT.iter().filter(|k| k.from == from && k.to == to && k.qp_types.contains(&qp_type)).peekable();
    let mut rule = match linux {
        Some(rule) => rule,
        None if kept.peek().is_some() => BARE,
        None => return None,
    };
    for k in kept {
        rule.required &= !k.unrequire;
        rule.optional |= k.unrequire | k.allow;
    }
    Some(rule)
}

/// Checks the mask of a Modify QP from `from` to `to` as `ib_modify_qp_is_ok` does: EINVAL
/// for a transition not in the table, a required bit missing, or any bit beyond the
/// required, the optional and `IBV_QP_STATE` (unknown bits included). `IBV_QP_CUR_STATE` is
/// optional only out of RTR, RTS, SQD and SQE, so the table alone refuses it elsewhere;
/// whether its value names the current state is the caller's check.
pub fn check(qp_type: QpType, from: QpState, to: QpState, mask: c_int) -> Result<(), c_int> {
    let rule = rule(qp_type, from, to).ok_or(libc::EINVAL)?;
    if mask & rule.required != rule.required || mask & !(rule.required | rule.optional | IBV_QP_STATE) != 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

    #[test]
    fn every_linux_row_is_one_pair() {
        for (i, a) in LINUX.iter().enumerate() {
            assert!(!LINUX[i + 1..].iter().any(|b| a.from == b.from && a.to == b.to), "{} -> {}", a.from, a.to);
        }
    }

    /// The current state is optional exactly at RTR → RTS, RTS → RTS, SQD → RTS and SQE →
    /// RTS (for UC and UD there; RC has no SQE), and never required.
    #[test]
    fn cur_state_only_where_linux_honours_it() {
        for ty in TYPES {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let Some(rule) = rule(ty, from, to) else { continue };
                    assert_eq!(rule.required & CUR, 0);
                    let want = to == S::Rts
                        && matches!(from, S::Rtr | S::Rts | S::Sqd | S::Sqe)
                        && !(ty == QpType::Rc && from == S::Sqe);
                    assert_eq!(rule.optional & CUR != 0, want, "{ty:?} {from} -> {to}");
                }
            }
        }
    }

    #[test]
    fn transitions_are_linux_plus_reset_to_error() {
        let valid = |from, to| rule(QpType::Rc, from, to).is_some();
        for from in QpState::ALL {
            assert!(valid(from, S::Error), "{from} -> Error");
            assert!(valid(from, S::Reset), "{from} -> Reset");
            assert!(!valid(from, S::Sqe), "{from} -> SQE");
        }
        for (from, to) in [(S::Rtr, S::Rtr), (S::Sqe, S::Sqe), (S::Init, S::Rts), (S::Rts, S::Rtr), (S::Reset, S::Rtr)]
        {
            assert!(!valid(from, to), "{from} -> {to}");
        }
    }

    /// A Raw Packet QP takes the port at Reset -> Init (required) and Init -> Init, nothing
    /// else anywhere (the kernel's column, and MOD-RAW-1).
    #[test]
    fn raw_packet_takes_the_port_only() {
        let raw = QpType::RawEthertype;
        assert_eq!(check(raw, S::Reset, S::Init, IBV_QP_STATE | IBV_QP_PORT), Ok(()));
        assert_eq!(check(raw, S::Reset, S::Init, IBV_QP_STATE), Err(libc::EINVAL));
        assert_eq!(check(raw, S::Reset, S::Init, IBV_QP_STATE | IBV_QP_PORT | PKEY), Err(libc::EINVAL));
        assert_eq!(check(raw, S::Init, S::Init, IBV_QP_STATE | IBV_QP_PORT), Ok(()));
        assert_eq!(check(raw, S::Init, S::Rtr, IBV_QP_STATE), Ok(()));
        assert_eq!(check(raw, S::Init, S::Rtr, IBV_QP_STATE | IBV_QP_QKEY), Err(libc::EINVAL));
        assert_eq!(check(raw, S::Rtr, S::Rts, IBV_QP_STATE), Ok(()));
        assert_eq!(check(raw, S::Rtr, S::Rts, IBV_QP_STATE | IBV_QP_SQ_PSN), Err(libc::EINVAL));
        assert_eq!(check(raw, S::Sqe, S::Rts, IBV_QP_STATE), Ok(()));
    }

    #[test]
    fn check_applies_required_optional_and_kept() {
        let rc_rtr = IBV_QP_STATE | PATH | IBV_QP_MAX_DEST_RD_ATOMIC;
        assert_eq!(check(QpType::Rc, S::Init, S::Rtr, rc_rtr), Ok(()));
        assert_eq!(check(QpType::Rc, S::Init, S::Rtr, rc_rtr | RNR_TIMER), Ok(()));
        assert_eq!(check(QpType::Rc, S::Init, S::Rtr, rc_rtr & !IBV_QP_PATH_MTU), Err(libc::EINVAL));
        assert_eq!(check(QpType::Rc, S::Init, S::Rtr, rc_rtr | IBV_QP_TIMEOUT), Err(libc::EINVAL));
        assert_eq!(check(QpType::Uc, S::Init, S::Rtr, IBV_QP_STATE | PATH | RNR_TIMER), Err(libc::EINVAL));
        assert_eq!(
            check(QpType::Rc, S::Reset, S::Init, IBV_QP_STATE | CUR | PKEY | IBV_QP_PORT | ACCESS),
            Err(libc::EINVAL)
        );
        assert_eq!(check(QpType::Ud, S::Rts, S::Rts, CUR | IBV_QP_QKEY), Ok(()));
        assert_eq!(check(QpType::Ud, S::Rts, S::Rts, IBV_QP_CAP), Err(libc::EINVAL));
        assert_eq!(check(QpType::Ud, S::Rts, S::Rts, 1 << 21), Err(libc::EINVAL));
        assert_eq!(check(QpType::Rc, S::Sqd, S::Rts, IBV_QP_STATE | IBV_QP_TIMEOUT | CUR), Ok(()));
        assert_eq!(check(QpType::Rc, S::Sqd, S::Rts, IBV_QP_STATE | IBV_QP_PATH_MTU), Err(libc::EINVAL));
        assert_eq!(check(QpType::Ud, S::Reset, S::Error, IBV_QP_STATE), Ok(()));
        assert_eq!(check(QpType::Ud, S::Reset, S::Error, IBV_QP_STATE | IBV_QP_QKEY), Err(libc::EINVAL));
    }
}
