//! Multicast groups (IBA 10.5; the verbs Attach QP to Multicast Group and Detach QP from
//! Multicast Group, `ibv_attach_mcast`): which of the device's UD QPs a packet addressed to a
//! multicast GID with BTH:DestQP 0xFFFFFF goes to. Each attached QP gets its own copy, checked
//! against its own state, P_Key and Q_Key as a unicast packet would be (`engine::deliver`).
//!
//! The table is read only for multicast packets: unicast traffic never takes its lock. A link
//! that must do something to hear a group (the UDP link binds a socket to it and joins it on
//! the interface) is told when a group gets its first QP and loses its last.

use rustc_hash::FxHashMap;

use crate::types::Gid;

/// BTH:DestQP of every multicast packet; never a QP's number (CRT-QP-15).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// The device's limits (`ibv_device_attr`'s `max_mcast_grp`, `max_mcast_qp_attach`,
/// `max_total_mcast_qp_attach`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub groups: usize,
    pub per_group: usize,
    pub total: usize,
}

/// Why an attach was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A new group would pass `Limits::groups`, the group `per_group` or the device `total`.
    Full,
    /// The link could not start hearing the group.
    Link,
}

/// MGID → the numbers of the QPs attached, in attach order.
#[derive(Default)]
pub(crate) struct Groups {
    members: FxHashMap<Gid, Vec<u32>>,
    attached: usize,
}

impl Groups {
    /// Attaches `qpn` to `mgid`. Attaching a QP that is already a member changes nothing and
    /// succeeds (uverbs answers 0 so). `join` is called when the group is new; false refuses
    /// the attach.
    pub fn attach(&mut self, mgid: Gid, qpn: u32, limits: Limits, join: impl FnOnce() -> bool) -> Result<(), Refusal> {
        let known = self.members.get(&mgid);
        if known.is_some_and(|m| m.contains(&qpn)) {
            return Ok(());
        }
        let full = match known {
            Some(m) => m.len() >= limits.per_group,
            None => self.members.len() >= limits.groups || limits.per_group == 0,
        };
        if full || self.attached >= limits.total {
            return Err(Refusal::Full);
        }
        if known.is_none() && !join() {
            return Err(Refusal::Link);
        }
        self.members.entry(mgid).or_default().push(qpn);
        self.attached += 1;
        Ok(())
    }

    /// Detaches `qpn` from `mgid`; false when it was not attached. `leave` is called when the
    /// group loses its last member.
    pub fn detach(&mut self, mgid: Gid, qpn: u32, leave: impl FnOnce()) -> bool {
        let Some(m) = self.members.get_mut(&mgid) else { return false };
        let Some(at) = m.iter().position(|&q| q == qpn) else { return false };
        m.remove(at);
        self.attached -= 1;
        if m.is_empty() {
            self.members.remove(&mgid);
            leave();
        }
        true
    }

    /// Detaches `qpn` from every group (its QP is being destroyed); `leave` for each group
    /// left empty.
    pub fn detach_all(&mut self, qpn: u32, mut leave: impl FnMut(Gid)) {
        if self.attached == 0 {
            return;
        }
        for g in self.of(qpn) {
            self.detach(g, qpn, || leave(g));
        }
    }

    /// The QPs attached to `mgid`.
    pub fn members(&self, mgid: Gid) -> &[u32] {
        self.members.get(&mgid).map_or(&[], |m| m.as_slice())
    }

    /// The groups `qpn` is attached to.
    pub fn of(&self, qpn: u32) -> Vec<Gid> {
        let mut v: Vec<Gid> = self.members.iter().filter(|(_, m)| m.contains(&qpn)).map(|(g, _)| *g).collect();
        v.sort_by_key(|g| g.0);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { groups: 2, per_group: 2, total: 3 };

    fn gid(last: u8) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xFF;
        g[15] = last;
        Gid(g)
    }

    #[test]
    fn limits_and_the_link_are_checked_once_per_new_group() {
        let mut g = Groups::default();
        let mut joins = 0;
        let mut join = || {
            joins += 1;
            true
        };
        assert_eq!(g.attach(gid(1), 10, LIMITS, &mut join), Ok(()));
        assert_eq!(g.attach(gid(1), 10, LIMITS, &mut join), Ok(()), "a member again: no change");
        assert_eq!(g.attach(gid(1), 11, LIMITS, &mut join), Ok(()));
        assert_eq!(g.attach(gid(1), 12, LIMITS, &mut join), Err(Refusal::Full), "per group");
        assert_eq!(g.attach(gid(2), 12, LIMITS, &mut join), Ok(()));
        assert_eq!(g.attach(gid(2), 13, LIMITS, &mut join), Err(Refusal::Full), "in all");
        assert_eq!(g.attach(gid(3), 13, LIMITS, &mut join), Err(Refusal::Full), "groups");
        assert_eq!(joins, 2);
        assert_eq!(g.members(gid(1)), &[10, 11]);
        assert_eq!(g.attach(gid(3), 13, Limits { groups: 9, per_group: 9, total: 9 }, || false), Err(Refusal::Link));
        assert!(g.members(gid(3)).is_empty());
    }

    #[test]
    fn the_last_member_out_leaves_the_group() {
        let mut g = Groups::default();
        g.attach(gid(1), 10, LIMITS, || true).unwrap();
        g.attach(gid(1), 11, LIMITS, || true).unwrap();
        g.attach(gid(2), 10, LIMITS, || true).unwrap();
        let mut left = Vec::new();
        assert!(!g.detach(gid(1), 12, || left.push(1)), "not a member");
        assert!(g.detach(gid(1), 11, || left.push(1)));
        assert!(left.is_empty());
        assert_eq!(g.of(10), vec![gid(1), gid(2)]);
        g.detach_all(10, |m| left.push(m.0[15]));
        left.sort();
        assert_eq!(left, vec![1, 2]);
        assert!(g.members(gid(1)).is_empty() && g.of(10).is_empty());
        assert_eq!(g.attach(gid(3), 20, Limits { total: 1, ..LIMITS }, || true), Ok(()), "the count went down");
    }
}
