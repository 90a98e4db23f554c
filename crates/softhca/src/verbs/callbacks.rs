//! User callbacks — completion and asynchronous event handlers — never run while softhca holds
//! a QP or CQ lock. Inside a verb or an engine step they are queued and run when it returns, so
//! a handler may call any verb, on the same QP or CQ included.

use std::cell::RefCell;

type Call = Box<dyn FnOnce()>;

thread_local! {
    static PENDING: RefCell<Option<Vec<Call>>> = const { RefCell::new(None) };
}

/// Closes the outermost scope even if a callback panics, so later verbs do not queue forever.
struct Outermost;

impl Drop for Outermost {
    fn drop(&mut self) {
        PENDING.with(|p| *p.borrow_mut() = None);
    }
}

/// Runs `f`; callbacks raised meanwhile run after it, on this thread, once no lock is held.
/// Nested scopes hand theirs to the outermost.
pub(crate) fn scope<R>(f: impl FnOnce() -> R) -> R {
    let outermost = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        p.is_none().then(|| *p = Some(Vec::new())).is_some()
    });
    if !outermost {
        return f();
    }
    let _guard = Outermost;
    let r = f();
    loop {
        // A callback that calls verbs may raise more; they join this same loop.
        let calls = PENDING.with(|p| p.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default());
        if calls.is_empty() {
            break;
        }
        for c in calls {
            c();
        }
    }
    r
}

/// Runs `call` now when no scope is open on this thread, else when the outermost one ends.
pub(crate) fn call(call: impl FnOnce() + 'static) {
    let now = PENDING.with(|p| match p.borrow_mut().as_mut() {
        Some(queue) => {
            queue.push(Box::new(call));
            None
        }
        None => Some(call),
    });
    if let Some(c) = now {
        c();
    }
}
