//! The conformance suite for [`StateBackend`] implementations, as plain functions taking a
//! backend factory `(max_parallelism, key-group range) -> backend`, and the
//! [`conformance_suite!`] macro that turns the whole list into tests for one backend: a
//! backend's tests invoke the macro once, so memory (and with it fs) and rocksdb are held to
//! the same behaviour and none can skip a case. A new case is added to the macro's list.
//!
//! The functions panic on a violation (they are test code, compiled only for tests).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use rhai::Dynamic;
use weir_schema::StateKind;

use super::{Reach, SnapshotTarget, StateBackend};
use crate::checkpoint::{CheckpointStore, MemoryStore};
use crate::record::{Key, KeyGroupRange};

/// Makes a backend for a key-group range.
pub type Factory<'a> = &'a dyn Fn(u32, KeyGroupRange) -> Box<dyn StateBackend>;

fn key(i: i64) -> Key {
    Key::from_str_value(format!("k{i}").into())
}

pub fn value_state(factory: Factory<'_>) {
    let mut b = factory(16, KeyGroupRange::all(16));
    let s = b.register("count", StateKind::Value).unwrap();
    assert_eq!(b.register("count", StateKind::Value).unwrap(), s);
    assert!(b.get(s, &key(1)).unwrap().is_none());
    b.put(s, &key(1), Dynamic::from(5_i64)).unwrap();
    b.update(s, &key(1), &mut |v| {
        let n = v.as_ref().and_then(|d| d.as_int().ok()).unwrap_or(0);
        *v = Some(Dynamic::from(n + 1));
    })
    .unwrap();
    b.update(s, &key(2), &mut |v| {
        assert!(v.is_none());
        *v = Some(Dynamic::from(1_i64));
    })
    .unwrap();
    assert_eq!(b.get(s, &key(1)).unwrap().unwrap().as_int(), Ok(6));
    // A backend that lends values lends what `get` copies.
    if let Some(lent) = b.lend(s, &key(1)) {
        assert_eq!(lent.unwrap().unwrap().as_int(), Ok(6));
        assert!(b.lend(s, &key(9)).unwrap().unwrap().is_none());
    }
    let mut keys: Vec<String> = b
        .keys(s)
        .unwrap()
        .iter()
        .map(|k| k.to_dynamic().to_string())
        .collect();
    keys.sort();
    assert_eq!(keys, ["k1", "k2"]);
    b.clear(s, &key(1)).unwrap();
    assert!(b.get(s, &key(1)).unwrap().is_none());
    let other = b.register("other", StateKind::Value).unwrap();
    assert!(
        b.get(other, &key(2)).unwrap().is_none(),
        "states are separate namespaces"
    );
}

pub fn list_and_map_state(factory: Factory<'_>) {
    let mut b = factory(8, KeyGroupRange::all(8));
    let l = b.register("seen", StateKind::List).unwrap();
    let m = b.register("by_day", StateKind::Map).unwrap();
    for i in 0..3 {
        b.list_push(l, &key(1), Dynamic::from(i as i64)).unwrap();
    }
    let list = b.get(l, &key(1)).unwrap().unwrap().into_array().unwrap();
    assert_eq!(
        list.iter().map(|d| d.as_int().unwrap()).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    b.map_put(m, &key(1), "mon", Dynamic::from(1_i64)).unwrap();
    b.map_put(m, &key(1), "tue", Dynamic::from(2_i64)).unwrap();
    assert_eq!(
        b.map_get(m, &key(1), "tue").unwrap().unwrap().as_int(),
        Ok(2)
    );
    b.map_remove(m, &key(1), "tue").unwrap();
    assert!(b.map_get(m, &key(1), "tue").unwrap().is_none());
    assert!(b.map_get(m, &key(2), "mon").unwrap().is_none());
}

fn ints(b: &dyn StateBackend, s: super::StateId, k: &Key) -> Vec<i64> {
    b.get(s, k)
        .unwrap()
        .map(|d| d.into_array().unwrap())
        .unwrap_or_default()
        .iter()
        .map(|d| d.as_int().unwrap())
        .collect()
}

/// `list_len`, `list_pop`, `list_trim`, `map_len`, `map_keys` and `read`, also on absent
/// keys; lists and maps left empty are removed; the result survives a snapshot and restore.
pub fn list_and_map_housekeeping(factory: Factory<'_>) {
    let mut b = factory(8, KeyGroupRange::all(8));
    let l = b.register("recent", StateKind::List).unwrap();
    let m = b.register("by_day", StateKind::Map).unwrap();
    let (k, absent) = (key(1), key(2));
    assert_eq!(b.list_len(l, &absent).unwrap(), 0);
    assert!(b.list_pop(l, &absent).unwrap().is_none());
    assert_eq!(b.list_trim(l, &absent, 3).unwrap(), 0);
    assert!(b.get(l, &absent).unwrap().is_none(), "nothing was created");
    for i in 0..10 {
        b.list_push(l, &k, Dynamic::from(i as i64)).unwrap();
    }
    assert_eq!(b.list_len(l, &k).unwrap(), 10);
    assert_eq!(b.list_pop(l, &k).unwrap().unwrap().as_int(), Ok(9));
    assert_eq!(b.list_trim(l, &k, 4).unwrap(), 5, "keeps the newest 4");
    assert_eq!(ints(b.as_ref(), l, &k), [5, 6, 7, 8]);
    assert_eq!(b.list_trim(l, &k, 100).unwrap(), 0);
    assert_eq!(b.list_len(l, &k).unwrap(), 4);
    let mut seen = None;
    b.read(l, &k, &mut |v| seen = v.map(|d| d.to_string()))
        .unwrap();
    assert_eq!(seen.as_deref(), Some("[5, 6, 7, 8]"));

    assert_eq!(b.map_len(m, &k).unwrap(), 0);
    assert!(b.map_keys(m, &k).unwrap().is_empty());
    for day in ["tue", "mon", "wed"] {
        b.map_put(m, &k, day, Dynamic::from(1_i64)).unwrap();
    }
    b.map_put(m, &k, "mon", Dynamic::from(2_i64)).unwrap();
    assert_eq!(b.map_len(m, &k).unwrap(), 3);
    assert_eq!(b.map_keys(m, &k).unwrap(), ["mon", "tue", "wed"]);

    // Survives a snapshot and restore, as trimmed.
    let snap = b.snapshot(KeyGroupRange::all(8)).unwrap();
    let mut c = factory(8, KeyGroupRange::all(8));
    c.restore(&[&snap]).unwrap();
    let (l2, m2) = (
        c.register("recent", StateKind::List).unwrap(),
        c.register("by_day", StateKind::Map).unwrap(),
    );
    assert_eq!(ints(c.as_ref(), l2, &k), [5, 6, 7, 8]);
    assert_eq!(c.map_keys(m2, &k).unwrap(), ["mon", "tue", "wed"]);

    // Emptied lists and maps disappear, so they cost nothing and `keys` no longer lists them.
    assert_eq!(b.list_trim(l, &k, 0).unwrap(), 4);
    assert!(b.get(l, &k).unwrap().is_none());
    b.list_push(l, &k, Dynamic::from(1_i64)).unwrap();
    assert_eq!(b.list_pop(l, &k).unwrap().unwrap().as_int(), Ok(1));
    assert!(b.get(l, &k).unwrap().is_none());
    assert!(b.keys(l).unwrap().is_empty());
    for day in ["mon", "tue", "wed"] {
        b.map_remove(m, &k, day).unwrap();
    }
    assert!(b.get(m, &k).unwrap().is_none());
    assert!(b.keys(m).unwrap().is_empty());
}

pub fn kind_mismatch_is_an_error(factory: Factory<'_>) {
    let mut b = factory(8, KeyGroupRange::all(8));
    b.register("x", StateKind::Value).unwrap();
    assert!(b.register("x", StateKind::List).is_err());
}

/// Fills one backend holding every key group, snapshots it in two halves, restores the halves
/// into three backends of another split and checks every key landed in exactly one.
pub fn snapshot_restore_rescale(factory: Factory<'_>) {
    let m = 32;
    let mut full = factory(m, KeyGroupRange::all(m));
    let s = full.register("sum", StateKind::Value).unwrap();
    let l = full.register("items", StateKind::List).unwrap();
    for i in 0..200 {
        full.put(s, &key(i), Dynamic::from(i)).unwrap();
        full.list_push(l, &key(i), Dynamic::from("x")).unwrap();
    }
    let a = full.snapshot(KeyGroupRange { start: 0, end: 16 }).unwrap();
    let b = full.snapshot(KeyGroupRange { start: 16, end: 32 }).unwrap();
    let mut total = 0;
    for sub in 0..3 {
        let range = KeyGroupRange::for_subtask(m, 3, sub);
        let mut back = factory(m, range);
        back.restore(&[&a, &b]).unwrap();
        let s2 = back.register("sum", StateKind::Value).unwrap();
        let l2 = back.register("items", StateKind::List).unwrap();
        for k in back.keys(s2).unwrap() {
            assert!(range.contains(k.key_group(m)));
            let v = back.get(s2, &k).unwrap().unwrap().as_int().unwrap();
            assert_eq!(k.to_dynamic().to_string(), format!("k{v}"));
            assert_eq!(
                back.get(l2, &k)
                    .unwrap()
                    .unwrap()
                    .into_array()
                    .unwrap()
                    .len(),
                1
            );
            total += 1;
        }
    }
    assert_eq!(total, 200);
}

/// `prefetch` is a hint and nothing else: of keys held live, restored (packed, in the memory
/// backend) or absent, and of keys outside the backend's key groups, it changes no read, and
/// between two calls for one key a prefetch of another key changes neither.
pub fn prefetch_is_only_a_hint(factory: Factory<'_>) {
    let m = 16;
    let range = KeyGroupRange::for_subtask(m, 2, 0);
    let mine: Vec<Key> = (0..400)
        .map(key)
        .filter(|k| range.contains(k.key_group(m)))
        .collect();
    let theirs: Vec<Key> = (0..400)
        .map(key)
        .filter(|k| !range.contains(k.key_group(m)))
        .collect();
    assert!(mine.len() > 50 && theirs.len() > 50);
    let mut b = factory(m, range);
    let (v, l, mp) = (
        b.register("v", StateKind::Value).unwrap(),
        b.register("l", StateKind::List).unwrap(),
        b.register("m", StateKind::Map).unwrap(),
    );
    // Half the keys written, then restored into another backend (held as the snapshot's
    // bytes until written), the other half written there.
    let (first, second) = mine.split_at(mine.len() / 2);
    let write = |b: &mut Box<dyn StateBackend>, keys: &[Key]| {
        for (i, k) in keys.iter().enumerate() {
            let i = i as i64;
            b.put(v, k, Dynamic::from(i)).unwrap();
            b.list_push(l, k, Dynamic::from(i)).unwrap();
            b.map_put(mp, k, "f", Dynamic::from(i)).unwrap();
        }
    };
    write(&mut b, first);
    let snap = b.snapshot(range).unwrap();
    let mut b = factory(m, range);
    b.restore(&[&snap]).unwrap();
    assert_eq!(b.register("v", StateKind::Value).unwrap(), v);
    assert_eq!(b.register("l", StateKind::List).unwrap(), l);
    assert_eq!(b.register("m", StateKind::Map).unwrap(), mp);
    write(&mut b, &second[..second.len() / 2]);
    let reads = |b: &dyn StateBackend| -> Vec<String> {
        mine.iter()
            .map(|k| {
                format!(
                    "{:?} {:?} {:?}",
                    b.get(v, k).unwrap().map(|d| d.to_string()),
                    b.get(l, k).unwrap().map(|d| d.to_string()),
                    b.map_get(mp, k, "f").unwrap().map(|d| d.to_string())
                )
            })
            .collect()
    };
    let before = reads(&*b);
    for k in mine.iter().chain(&theirs) {
        for reach in [Reach::Row, Reach::Values, Reach::Contents] {
            b.prefetch(k, reach);
        }
    }
    assert_eq!(reads(&*b), before);
    // A record's calls for its key, with prefetches of the next keys in between.
    for (k, next) in mine.iter().zip(mine.iter().skip(1).chain(&theirs)) {
        let n = b.get(v, k).unwrap().map_or(0, |d| d.as_int().unwrap());
        b.prefetch(next, Reach::Row);
        b.put(v, k, Dynamic::from(n + 1)).unwrap();
        b.prefetch(next, Reach::Values);
        b.prefetch(next, Reach::Contents);
        b.list_push(l, k, Dynamic::from(n + 1)).unwrap();
        assert_eq!(b.get(v, k).unwrap().unwrap().as_int(), Ok(n + 1));
        assert_eq!(ints(&*b, l, k).last(), Some(&(n + 1)));
    }
}

pub fn snapshot_is_isolated_from_later_writes(factory: Factory<'_>) {
    let mut b = factory(8, KeyGroupRange::all(8));
    let s = b.register("v", StateKind::Value).unwrap();
    b.put(s, &key(1), Dynamic::from(1_i64)).unwrap();
    let snap = b.snapshot(KeyGroupRange::all(8)).unwrap();
    b.put(s, &key(1), Dynamic::from(2_i64)).unwrap();
    let mut c = factory(8, KeyGroupRange::all(8));
    c.restore(&[&snap]).unwrap();
    let s = c.register("v", StateKind::Value).unwrap();
    assert_eq!(c.get(s, &key(1)).unwrap().unwrap().as_int(), Ok(1));
}

pub fn bad_snapshot_is_an_error(factory: Factory<'_>) {
    let mut b = factory(8, KeyGroupRange::all(8));
    assert!(b.restore(&[b"not a snapshot"]).is_err());
    let other = factory(16, KeyGroupRange::all(16))
        .snapshot(KeyGroupRange::all(16))
        .unwrap();
    assert!(
        b.restore(&[&other]).is_err(),
        "max_parallelism mismatch must be rejected"
    );
}

/// Checkpoints two subtasks through the two-phase path a task uses
/// ([`StateBackend::checkpoint`] at the barrier, later writes, [`PendingSnapshot::write`],
/// [`StateBackend::checkpoint_complete`]) into a store, then restores with
/// [`StateBackend::restore_files`]: each subtask's own files into a backend of the same
/// range, and every file into three backends of another split. Each sees exactly the state
/// at the barrier, whatever order it registers its states in.
///
/// [`PendingSnapshot::write`]: super::PendingSnapshot::write
pub fn checkpoint_files_restore_rescale(factory: Factory<'_>) {
    let m = 32;
    let n = 300;
    let store = MemoryStore::new();
    let mut own = Vec::new();
    let mut all = Vec::new();
    for sub in 0..2 {
        let range = KeyGroupRange::for_subtask(m, 2, sub);
        let mut b = factory(m, range);
        let s = b.register("sum", StateKind::Value).unwrap();
        let l = b.register("items", StateKind::List).unwrap();
        let mine: Vec<i64> = (0..n)
            .filter(|&i| range.contains(key(i).key_group(m)))
            .collect();
        for &i in &mine {
            b.put(s, &key(i), Dynamic::from(i)).unwrap();
            b.list_push(l, &key(i), Dynamic::from("x")).unwrap();
        }
        let pending = b.checkpoint(1).unwrap();
        for &i in &mine {
            b.put(s, &key(i), Dynamic::from(-1_i64)).unwrap();
            b.list_push(l, &key(i), Dynamic::from("late")).unwrap();
        }
        let target = SnapshotTarget {
            checkpoint: 1,
            private_prefix: format!("chk-1/op-{sub}"),
            shared_prefix: format!("shared/op-{sub}"),
        };
        let files = pending.write(&store, &target).unwrap();
        b.checkpoint_complete(1);
        assert!(!files.is_empty());
        for f in &files {
            assert_eq!(
                store.size(&f.path).unwrap(),
                f.size,
                "{} is listed with its size",
                f.path
            );
        }
        all.extend(files.iter().cloned());
        own.push((range, files));
    }

    let check = |b: &mut dyn StateBackend, range: KeyGroupRange| -> usize {
        let l = b.register("items", StateKind::List).unwrap();
        let extra = b.register("extra", StateKind::Value).unwrap();
        let s = b.register("sum", StateKind::Value).unwrap();
        let mut count = 0;
        for k in b.keys(s).unwrap() {
            assert!(range.contains(k.key_group(m)));
            let v = b.get(s, &k).unwrap().unwrap().as_int().unwrap();
            assert_eq!(k.to_dynamic().to_string(), format!("k{v}"));
            let items = b.get(l, &k).unwrap().unwrap().into_array().unwrap();
            assert_eq!(items.len(), 1, "writes after the barrier must not show");
            assert!(b.get(extra, &k).unwrap().is_none());
            count += 1;
        }
        assert_eq!(b.keys(l).unwrap().len(), count);
        assert!(b.keys(extra).unwrap().is_empty());
        count
    };

    let mut total = 0;
    for (range, files) in &own {
        let mut b = factory(m, *range);
        // Registered before the restore, in another order than when written.
        b.register("items", StateKind::List).unwrap();
        b.restore_files(&store, files).unwrap();
        total += check(b.as_mut(), *range);
    }
    assert_eq!(total, n as usize);

    let mut total = 0;
    for sub in 0..3 {
        let range = KeyGroupRange::for_subtask(m, 3, sub);
        let mut b = factory(m, range);
        b.restore_files(&store, &all).unwrap();
        total += check(b.as_mut(), range);
    }
    assert_eq!(total, n as usize);
}

/// Keyed timers ([`Timers`](super::timers::Timers)) on the backend: set, delete, fire in time
/// order; through a checkpoint into this backend's files, restored whole (fired timers stay
/// fired, pending ones come back and fire) and into three backends of another split (each
/// timer lands in exactly the subtask owning its key).
pub fn timers_checkpoint_restore_rescale(factory: Factory<'_>) {
    use super::timers::{TimeDomain, Timers};
    let m = 32;
    let store = MemoryStore::new();
    let mut b = factory(m, KeyGroupRange::all(m));
    let mut t = Timers::register(b.as_mut()).unwrap();
    for i in 0..40 {
        t.set(b.as_mut(), TimeDomain::Event, &key(i), 100 + i).unwrap();
        t.set(b.as_mut(), TimeDomain::Processing, &key(i), 1_000 - i).unwrap();
    }
    assert!(t.delete(b.as_mut(), TimeDomain::Event, &key(39), 139).unwrap());
    let mut fired = Vec::new();
    while let Some((time, _)) = t.pop_due(b.as_mut(), TimeDomain::Event, 109).unwrap() {
        fired.push(time);
    }
    assert_eq!(fired, (100..110).collect::<Vec<_>>(), "in time order, once each");
    let pending = b.checkpoint(1).unwrap();
    // After the barrier: must not show in the restored state.
    t.set(b.as_mut(), TimeDomain::Event, &key(99), 5).unwrap();
    let target = SnapshotTarget {
        checkpoint: 1,
        private_prefix: "chk-1/op-0".to_owned(),
        shared_prefix: "shared/op-0".to_owned(),
    };
    let files = pending.write(&store, &target).unwrap();

    let mut whole = factory(m, KeyGroupRange::all(m));
    let mut restored = Timers::register(whole.as_mut()).unwrap();
    whole.restore_files(&store, &files).unwrap();
    restored.rebuild(whole.as_ref()).unwrap();
    assert_eq!(restored.len(TimeDomain::Event), 29);
    assert_eq!(restored.len(TimeDomain::Processing), 40);
    assert_eq!(restored.next(TimeDomain::Event), Some(110));
    assert_eq!(restored.next(TimeDomain::Processing), Some(961));
    let mut times = Vec::new();
    while let Some((time, k)) = restored
        .pop_due(whole.as_mut(), TimeDomain::Event, i64::MAX)
        .unwrap()
    {
        assert_eq!(k, key(time - 100));
        times.push(time);
    }
    assert_eq!(times, (110..139).collect::<Vec<_>>());

    let mut total = [0, 0];
    for sub in 0..3 {
        let range = KeyGroupRange::for_subtask(m, 3, sub);
        let mut part = factory(m, range);
        let mut timers = Timers::register(part.as_mut()).unwrap();
        part.restore_files(&store, &files).unwrap();
        timers.rebuild(part.as_ref()).unwrap();
        total[0] += timers.len(TimeDomain::Event);
        total[1] += timers.len(TimeDomain::Processing);
        while let Some((_, k)) = timers
            .pop_due(part.as_mut(), TimeDomain::Processing, i64::MAX)
            .unwrap()
        {
            assert!(range.contains(k.key_group(m)));
        }
        assert_eq!(timers.len(TimeDomain::Processing), 0);
    }
    assert_eq!(total, [29, 40]);
}

/// State time-to-live ([`Ttl`](super::ttl::Ttl)) on the backend, for value, list and map
/// states: a value reads as absent once expired, a write renews it (a read too under
/// `on_read_and_write`), a clear forgets its expiry; expiry times survive a snapshot and
/// restore into another split, where expired values are absent; a sweep removes every
/// expired value, so that nothing is left behind.
pub fn ttl_expiry(factory: Factory<'_>) {
    use super::ttl::{Access, STATE, Ttl, TtlRule};
    let m = 16;
    let mut b = factory(m, KeyGroupRange::all(m));
    let v = b.register("v", StateKind::Value).unwrap();
    let l = b.register("l", StateKind::List).unwrap();
    let mp = b.register("m", StateKind::Map).unwrap();
    let plain = b.register("plain", StateKind::Value).unwrap();
    let rules = |v, l, mp| {
        vec![
            TtlRule { state: v, name: "v".to_owned(), ttl_ms: 100, renew_on_read: false },
            TtlRule { state: l, name: "l".to_owned(), ttl_ms: 100, renew_on_read: true },
            TtlRule { state: mp, name: "m".to_owned(), ttl_ms: 300, renew_on_read: false },
        ]
    };
    let ttl = Ttl::register(b.as_mut(), rules(v, l, mp)).unwrap().unwrap();
    assert_eq!(ttl.sweep_interval(), 100);
    // An access as a script makes it: expire, then act, then report.
    let write = |b: &mut dyn StateBackend, id, k: &Key, now, f: &dyn Fn(&mut dyn StateBackend)| {
        ttl.expire_if_due(b, id, k, now).unwrap();
        f(b);
        ttl.touched(b, id, k, now, Access::Write).unwrap();
    };
    let read = |b: &mut dyn StateBackend, id, k: &Key, now| -> Option<Dynamic> {
        ttl.expire_if_due(b, id, k, now).unwrap();
        let got = b.get(id, k).unwrap();
        ttl.touched(b, id, k, now, Access::Read).unwrap();
        got
    };
    for i in 0..20 {
        let k = key(i);
        write(b.as_mut(), v, &k, 1_000, &|b| b.put(v, &k, Dynamic::from(i)).unwrap());
        write(b.as_mut(), l, &k, 1_000, &|b| b.list_push(l, &k, Dynamic::from(i)).unwrap());
        write(b.as_mut(), mp, &k, 1_000, &|b| {
            b.map_put(mp, &k, "f", Dynamic::from(i)).unwrap();
        });
        b.put(plain, &k, Dynamic::from(i)).unwrap();
    }
    let k0 = key(0);
    assert!(read(b.as_mut(), v, &k0, 1_099).is_some(), "alive before its ttl");
    // A read renews `l` (on_read_and_write) but not `v` (on_write).
    assert!(read(b.as_mut(), l, &k0, 1_050).is_some());
    assert!(read(b.as_mut(), v, &k0, 1_100).is_none(), "expired at write + ttl");
    assert!(b.get(v, &k0).unwrap().is_none(), "and removed");
    assert!(read(b.as_mut(), l, &k0, 1_120).is_some(), "renewed by the read at 1050");
    // A write renews.
    let k1 = key(1);
    write(b.as_mut(), v, &k1, 1_090, &|b| b.put(v, &k1, Dynamic::from(-1_i64)).unwrap());
    assert_eq!(read(b.as_mut(), v, &k1, 1_150).unwrap().as_int(), Ok(-1));
    // A cleared value forgets its expiry; written again, it starts over.
    let k2 = key(2);
    b.clear(v, &k2).unwrap();
    ttl.touched(b.as_mut(), v, &k2, 1_010, Access::Clear).unwrap();
    assert!(!ttl.is_expired(b.as_ref(), v, &k2, 5_000).unwrap());

    // Across a snapshot and a restore into two halves, at 1_200: every `v` expired (k1's at
    // 1_190), every `l` but k0's (renewed by the read at 1_120 to 1_220); every `m` alive.
    let snap = b.snapshot(KeyGroupRange::all(m)).unwrap();
    let mut alive = [0, 0, 0, 0];
    for sub in 0..2 {
        let range = KeyGroupRange::for_subtask(m, 2, sub);
        let mut c = factory(m, range);
        c.restore(&[&snap]).unwrap();
        let (v2, l2, m2) = (
            c.register("v", StateKind::Value).unwrap(),
            c.register("l", StateKind::List).unwrap(),
            c.register("m", StateKind::Map).unwrap(),
        );
        let plain2 = c.register("plain", StateKind::Value).unwrap();
        let ttl2 = Ttl::register(c.as_mut(), rules(v2, l2, m2)).unwrap().unwrap();
        for i in 0..20 {
            let k = key(i);
            if !range.contains(k.key_group(m)) {
                continue;
            }
            for (slot, id) in [v2, l2, m2, plain2].into_iter().enumerate() {
                ttl2.expire_if_due(c.as_mut(), id, &k, 1_200).unwrap();
                if c.get(id, &k).unwrap().is_some() {
                    alive[slot] += 1;
                }
            }
        }
        // Sweeping at 1_400 leaves only the states without a ttl, and no expiry times.
        ttl2.sweep(c.as_mut(), 1_400).unwrap();
        assert!(c.keys(v2).unwrap().is_empty());
        assert!(c.keys(l2).unwrap().is_empty());
        assert!(c.keys(m2).unwrap().is_empty());
        let index = c.register(STATE, StateKind::Map).unwrap();
        assert!(c.keys(index).unwrap().is_empty(), "no expiry time is left behind");
        for k in c.keys(plain2).unwrap() {
            assert!(range.contains(k.key_group(m)));
        }
    }
    // v: k2 was cleared without expiry, the rest expired. l: only k0 (renewed). m: all 20.
    assert_eq!(alive, [0, 1, 20, 20]);
}

/// Expands to one `#[test]` per conformance case. `$run` is an expression of type
/// `fn(Factory<'_>)` (or a closure of that shape) that builds the backend's factory, runs the
/// case it is given and checks what it must afterwards (e.g. that working directories are
/// gone).
macro_rules! conformance_suite {
    ($run:expr) => {
        $crate::state::conformance::conformance_suite!(@cases $run;
            value_state,
            list_and_map_state,
            list_and_map_housekeeping,
            kind_mismatch_is_an_error,
            snapshot_restore_rescale,
            snapshot_is_isolated_from_later_writes,
            prefetch_is_only_a_hint,
            bad_snapshot_is_an_error,
            checkpoint_files_restore_rescale,
            timers_checkpoint_restore_rescale,
            ttl_expiry,
        );
    };
    (@cases $run:expr; $($case:ident,)+) => {
        $(
            #[test]
            fn $case() {
                let run: fn(fn($crate::state::conformance::Factory<'_>)) = $run;
                run($crate::state::conformance::$case);
            }
        )+
    };
}
pub(crate) use conformance_suite;
