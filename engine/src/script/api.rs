//! The script API reference, as data: every function Weir registers on the Rhai engine
//! ([`HOST_FUNCTIONS`]) and every function a script defines for its operator to call
//! ([`ENTRY_POINTS`]), each with its signature, meaning, errors and an example.
//!
//! This table is the single source of truth: [`render_markdown`] turns it into
//! `docs/SCRIPT_API.md`, and the tests check it against the engine both ways (every function
//! the runtime engine registers beyond Rhai's standard library has an entry, every entry is
//! registered with its arity), run every example and check what it emits, and fail when
//! `docs/SCRIPT_API.md` differs from the rendering. Regenerate the file with
//! `WEIR_BLESS=1 cargo test -p weir-engine --release script_api`.

/// A function Weir registers for scripts to call.
#[derive(Clone, Copy, Debug)]
pub struct HostFn {
    /// The name scripts call.
    pub name: &'static str,
    /// Parameter names and types, as written in the signature.
    pub params: &'static [&'static str],
    /// The returned type.
    pub returns: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// When it fails (the record then fails under the operator's `on_error`).
    pub errors: &'static str,
    /// The operator types whose scripts may call it.
    pub operators: &'static [&'static str],
    /// A `process` script over the keyed records `1`, `2`, `3` of key `"u"`, with the states
    /// `count` (value), `seen` (list) and `by` (map) declared.
    pub example: &'static str,
    /// What the example emits, as JSON lines joined by `, `.
    pub emits: &'static str,
}

/// Where a function may be called from: every keyed `process` script.
const PROCESS: &[&str] = &["process"];

/// Every function Weir registers, in the order the reference lists them.
pub const HOST_FUNCTIONS: &[HostFn] = &[
    HostFn {
        name: "emit",
        params: &["record: any"],
        returns: "()",
        meaning: "Sends `record` downstream. A `process` function emits zero or more records \
                  per input record (its return value is ignored); `on_end` may emit too.",
        errors: "Called outside a `process` operator; called more than \
                 `limits.max_outputs_per_record` times for one input record.",
        operators: PROCESS,
        example: "fn process(r) { if r != 2 { emit(#{n: r}); } }",
        emits: r#"{"n":1}, {"n":3}"#,
    },
    HostFn {
        name: "get",
        params: &["record: map", "field: string", "default: any"],
        returns: "any",
        meaning: "The value of `field` in `record`, or `default` when the record has no such \
                  field or it is `()`/null. Reading a missing field with `r.field` is a record \
                  error; use `get` (or `\"field\" in r`) for optional fields. Also callable as \
                  `r.get(\"field\", default)`.",
        errors: "None.",
        operators: &[
            "map",
            "filter",
            "flat_map",
            "key_by",
            "reduce",
            "aggregate",
            "process",
        ],
        example: "fn process(r) { let m = #{a: r}; emit(get(m, \"a\", 0) + get(m, \"b\", 10)); }",
        emits: "11, 12, 13",
    },
    HostFn {
        name: "key",
        params: &[],
        returns: "any",
        meaning: "The key of the record being processed (as `key_by` produced it: a string \
                  or an integer), or `()` where there is no current key.",
        errors: "None.",
        operators: &["process", "reduce", "aggregate"],
        example: "fn process(r) { emit(`${key()}:${r}`); }",
        emits: r#""u:1", "u:2", "u:3""#,
    },
    HostFn {
        name: "state_get",
        params: &["state: string"],
        returns: "any",
        meaning: "The current key's value in the value state `state`, or `()` when unset.",
        errors: "`state` is not declared in the operator's `state:`; called outside a keyed \
                 `process` operator.",
        operators: PROCESS,
        example: "fn process(r) { let c = state_get(\"count\"); if c == () { c = 0; } \
                  state_set(\"count\", c + r); emit(c + r); }",
        emits: "1, 3, 6",
    },
    HostFn {
        name: "state_set",
        params: &["state: string", "value: any"],
        returns: "()",
        meaning: "Stores `value` for the current key in the value state `state`.",
        errors: "As `state_get`; the value exceeds `limits.max_string_size`, \
                 `max_array_size` or `max_map_size`.",
        operators: PROCESS,
        example: "fn process(r) { state_set(\"count\", r * 10); emit(state_get(\"count\")); }",
        emits: "10, 20, 30",
    },
    HostFn {
        name: "state_add",
        params: &["state: string", "amount: int | float"],
        returns: "int | float",
        meaning: "Adds `amount` to the current key's value in the value state `state` (unset \
                  counts as zero) and returns the new value: a counter or running sum in one \
                  state access instead of a `state_get` and a `state_set`.",
        errors: "As `state_get`; `amount` is not a number; the stored value is another kind \
                 of number or not a number; an integer overflow.",
        operators: PROCESS,
        example: "fn process(r) { emit(state_add(\"count\", r * 10)); }",
        emits: "10, 30, 60",
    },
    HostFn {
        name: "state_clear",
        params: &["state: string"],
        returns: "()",
        meaning: "Removes the current key's entry from the state `state` (of any kind).",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { state_set(\"count\", r); if r == 2 { state_clear(\"count\"); } \
                  emit(state_get(\"count\")); }",
        emits: "1, null, 3",
    },
    HostFn {
        name: "list_push",
        params: &["state: string", "item: any"],
        returns: "()",
        meaning: "Appends `item` to the current key's list in the list state `state`.",
        errors: "As `state_get`; the list would exceed a `limits:` size (keep it bounded with \
                 `list_trim` or `list_pop`).",
        operators: PROCESS,
        example: "fn process(r) { list_push(\"seen\", r); emit(list_get(\"seen\")); }",
        emits: "[1], [1,2], [1,2,3]",
    },
    HostFn {
        name: "list_get",
        params: &["state: string"],
        returns: "array",
        meaning: "The current key's whole list (empty when unset).",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { list_push(\"seen\", r * r); emit(list_get(\"seen\").len()); }",
        emits: "1, 2, 3",
    },
    HostFn {
        name: "list_len",
        params: &["state: string"],
        returns: "int",
        meaning: "The number of items in the current key's list.",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { list_push(\"seen\", r); emit(list_len(\"seen\")); }",
        emits: "1, 2, 3",
    },
    HostFn {
        name: "list_pop",
        params: &["state: string"],
        returns: "any",
        meaning: "Removes and returns the newest (last) item of the current key's list, or \
                  `()` when it is empty.",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { list_push(\"seen\", r); if r == 3 { emit(list_pop(\"seen\")); \
                  emit(list_get(\"seen\")); } }",
        emits: "3, [1,2]",
    },
    HostFn {
        name: "list_trim",
        params: &["state: string", "keep: int"],
        returns: "int",
        meaning: "Keeps only the newest `keep` items of the current key's list; returns how \
                  many were removed.",
        errors: "As `state_get`; `keep` is negative.",
        operators: PROCESS,
        example: "fn process(r) { list_push(\"seen\", r); let dropped = list_trim(\"seen\", 2); \
                  emit([dropped, list_get(\"seen\")]); }",
        emits: "[0,[1]], [0,[1,2]], [1,[2,3]]",
    },
    HostFn {
        name: "list_set",
        params: &["state: string", "items: array"],
        returns: "()",
        meaning: "Replaces the current key's whole list with `items` in one state access (an \
                  empty array removes it), instead of `state_clear` and a `list_push` per \
                  item.",
        errors: "As `state_get`; `items` exceeds a `limits:` size.",
        operators: PROCESS,
        example: "fn process(r) { list_set(\"seen\", [r, r * 2]); emit(list_get(\"seen\")); }",
        emits: "[1,2], [2,4], [3,6]",
    },
    HostFn {
        name: "list_top",
        params: &["state: string", "item: any", "keep: int"],
        returns: "bool",
        meaning: "Keeps the current key's list as its `keep` largest items, largest first: \
                  inserts `item` after the items equal to it, drops what falls beyond `keep`, \
                  and returns whether `item` stayed. Ints, floats and strings rank among their \
                  own kind. A top-k in one state access, without reading the list back.",
        errors: "As `state_get`; `keep` is negative; `item` does not rank against the list's \
                 items (other kinds, NaN); the list would exceed a `limits:` size.",
        operators: PROCESS,
        example: "fn process(r) { let kept = list_top(\"seen\", r * (4 - r), 2); \
                  emit([kept, list_get(\"seen\")]); }",
        emits: "[true,[3]], [true,[4,3]], [false,[4,3]]",
    },
    HostFn {
        name: "map_put",
        params: &["state: string", "field: string", "value: any"],
        returns: "()",
        meaning: "Sets `field` to `value` in the current key's map in the map state `state`.",
        errors: "As `state_get`; the map would exceed a `limits:` size (keep it bounded with \
                 `map_remove`).",
        operators: PROCESS,
        example: "fn process(r) { map_put(\"by\", `f${r % 2}`, r); emit(map_get(\"by\", \"f1\")); }",
        emits: "1, 1, 3",
    },
    HostFn {
        name: "map_get",
        params: &["state: string", "field: string"],
        returns: "any",
        meaning: "The value of `field` in the current key's map, or `()` when absent.",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { emit(map_get(\"by\", \"last\")); map_put(\"by\", \"last\", r); }",
        emits: "null, 1, 2",
    },
    HostFn {
        name: "map_add",
        params: &["state: string", "field: string", "amount: int | float"],
        returns: "int | float",
        meaning: "Adds `amount` to `field` of the current key's map (an absent field counts as \
                  zero) and returns the new value: a per-field counter in one state access.",
        errors: "As `state_add`; a new field would exceed `limits.max_map_size`.",
        operators: PROCESS,
        example: "fn process(r) { emit(map_add(\"by\", `f${r % 2}`, r)); }",
        emits: "1, 2, 4",
    },
    HostFn {
        name: "map_remove",
        params: &["state: string", "field: string"],
        returns: "()",
        meaning: "Removes `field` from the current key's map (nothing when absent).",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { map_put(\"by\", `f${r}`, r); map_remove(\"by\", \"f1\"); \
                  emit(map_len(\"by\")); }",
        emits: "0, 1, 2",
    },
    HostFn {
        name: "map_len",
        params: &["state: string"],
        returns: "int",
        meaning: "The number of fields in the current key's map.",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { map_put(\"by\", \"same\", r); emit(map_len(\"by\")); }",
        emits: "1, 1, 1",
    },
    HostFn {
        name: "map_keys",
        params: &["state: string"],
        returns: "array",
        meaning: "The fields of the current key's map.",
        errors: "As `state_get`.",
        operators: PROCESS,
        example: "fn process(r) { map_put(\"by\", `f${r}`, r); if r == 3 { let k = map_keys(\"by\"); \
                  k.sort(); emit(k); } }",
        emits: r#"["f1","f2","f3"]"#,
    },
    HostFn {
        name: "register_event_timer",
        params: &["time: int"],
        returns: "()",
        meaning: "Sets an event-time timer for the current key at `time` (epoch milliseconds): \
                  `fn on_timer(time, \"event\")` runs with this key current once the watermark \
                  reaches `time` (at the latest when the input ends). One timer per key and \
                  time: setting it again does nothing. Timers are keyed state: checkpoints and \
                  savepoints keep them.",
        errors: "The script defines no `fn on_timer(ts, kind)`; called outside a keyed \
                 `process` operator.",
        operators: PROCESS,
        example: "fn process(r) { register_event_timer(r * 10); register_event_timer(15); }\n\
                  fn on_timer(ts, kind) { emit(`${kind} ${ts}`); }",
        emits: r#""event 10", "event 15", "event 20", "event 30""#,
    },
    HostFn {
        name: "register_processing_timer",
        params: &["time: int"],
        returns: "()",
        meaning: "Sets a processing-time timer for the current key at `time` (epoch \
                  milliseconds, compare `now()`): `fn on_timer(time, \"processing\")` runs \
                  once the wall clock reaches it. Pending processing-time timers do not fire \
                  when the input ends.",
        errors: "As `register_event_timer`.",
        operators: PROCESS,
        example: "fn process(r) { register_processing_timer(now() + 1000 * r); }\n\
                  fn on_timer(ts, kind) { emit(`${kind} +${ts - 1700000000000}`); }",
        emits: r#""processing +1000", "processing +2000", "processing +3000""#,
    },
    HostFn {
        name: "delete_event_timer",
        params: &["time: int"],
        returns: "()",
        meaning: "Deletes the current key's event-time timer at `time` (nothing when there is \
                  none).",
        errors: "As `register_event_timer`.",
        operators: PROCESS,
        example: "fn process(r) { register_event_timer(r); delete_event_timer(r - 1); }\n\
                  fn on_timer(ts, kind) { emit(ts); }",
        emits: "3",
    },
    HostFn {
        name: "delete_processing_timer",
        params: &["time: int"],
        returns: "()",
        meaning: "Deletes the current key's processing-time timer at `time` (nothing when \
                  there is none).",
        errors: "As `register_event_timer`.",
        operators: PROCESS,
        example: "fn process(r) { register_processing_timer(now() + r); \
                  if r == 2 { delete_processing_timer(now() + 1); } }\n\
                  fn on_timer(ts, kind) { emit(ts % 1000); }",
        emits: "2, 3",
    },
    HostFn {
        name: "now",
        params: &[],
        returns: "int",
        meaning: "Processing time: the wall clock in epoch milliseconds (in `weir test`, a \
                  clock that moves only with `advance_time`). State time-to-live and \
                  processing-time timers follow the same clock.",
        errors: "Called outside a `process` operator.",
        operators: PROCESS,
        example: "fn process(r) { emit(now() - 1700000000000); }",
        emits: "0, 0, 0",
    },
    HostFn {
        name: "watermark",
        params: &[],
        returns: "int",
        meaning: "The operator's current event-time watermark in epoch milliseconds: every \
                  record with an earlier event time is expected to have arrived. Before the \
                  first watermark it is the smallest integer; in `on_timer` for an event-time \
                  timer it is the watermark that fired it.",
        errors: "Called outside a `process` operator.",
        operators: PROCESS,
        example: "fn process(r) { register_event_timer(r); }\n\
                  fn on_timer(ts, kind) { emit(watermark() > ts); }",
        emits: "true, true, true",
    },
];

/// A function a script defines for its operator to call.
#[derive(Clone, Copy, Debug)]
pub struct EntryPoint {
    /// The operator `type:`.
    pub operator: &'static str,
    /// The function's name.
    pub name: &'static str,
    /// Its parameters.
    pub params: &'static [&'static str],
    /// Whether the operator needs it (optional ones are called when defined).
    pub required: bool,
    /// What the operator does with it.
    pub meaning: &'static str,
    /// What a failure does.
    pub errors: &'static str,
    /// A whole script; the tests run it on the records `#{n: 1}`, `#{n: 2}`, `#{n: 3}` (all
    /// of key `"u"` where the operator is keyed; `process` with the states of
    /// [`HostFn::example`]).
    pub example: &'static str,
    /// What the operator outputs for the example, as JSON lines joined by `, `.
    pub emits: &'static str,
}

/// What a failing call does, for every entry point.
const FAILS_RECORD: &str = "A throw, a runtime error or a broken `limits:` fails the record \
                            under the operator's `on_error` (`fail`, `skip` or a dead letter).";

/// Every entry point, by operator type.
pub const ENTRY_POINTS: &[EntryPoint] = &[
    EntryPoint {
        operator: "map",
        name: "map",
        params: &["r"],
        required: true,
        meaning: "Returns the record that replaces `r`.",
        errors: FAILS_RECORD,
        example: "fn map(r) { #{n: r.n, double: r.n * 2} }",
        emits: r#"{"double":2,"n":1}, {"double":4,"n":2}, {"double":6,"n":3}"#,
    },
    EntryPoint {
        operator: "filter",
        name: "filter",
        params: &["r"],
        required: true,
        meaning: "Returns `true` to keep `r`, `false` to drop it.",
        errors: FAILS_RECORD,
        example: "fn filter(r) { r.n != 2 }",
        emits: r#"{"n":1}, {"n":3}"#,
    },
    EntryPoint {
        operator: "flat_map",
        name: "flat_map",
        params: &["r"],
        required: true,
        meaning: "Returns an array of records (possibly empty) that replace `r`.",
        errors: FAILS_RECORD,
        example: "fn flat_map(r) { if r.n == 2 { [] } else { [r, #{n: -r.n}] } }",
        emits: r#"{"n":1}, {"n":-1}, {"n":3}, {"n":-3}"#,
    },
    EntryPoint {
        operator: "key_by",
        name: "key",
        params: &["r"],
        required: true,
        meaning: "Returns the record's key (a string or an integer), when `field:` is not \
                  given.",
        errors: FAILS_RECORD,
        example: "fn key(r) { `k${r.n % 2}` }",
        emits: r#""k1", "k0", "k1""#,
    },
    EntryPoint {
        operator: "reduce",
        name: "reduce",
        params: &["acc", "r"],
        required: true,
        meaning: "Folds `r` into the key's accumulator `acc` (`r` itself for the key's first \
                  record) and returns the new accumulator; its output is the accumulator with \
                  the key added.",
        errors: FAILS_RECORD,
        example: "fn reduce(acc, r) { #{n: acc.n + r.n} }",
        emits: r#"{"key":"u","n":1}, {"key":"u","n":3}, {"key":"u","n":6}"#,
    },
    EntryPoint {
        operator: "aggregate",
        name: "init",
        params: &[],
        required: true,
        meaning: "Returns the empty accumulator of a new key (a scripted aggregate, without \
                  `aggregations:`).",
        errors: FAILS_RECORD,
        example: "fn init() { 0 }\nfn add(acc, r) { acc + r.n }",
        emits: r#"{"key":"u","value":1}, {"key":"u","value":3}, {"key":"u","value":6}"#,
    },
    EntryPoint {
        operator: "aggregate",
        name: "add",
        params: &["acc", "r"],
        required: true,
        meaning: "Adds `r` to the accumulator and returns it.",
        errors: FAILS_RECORD,
        example: "fn init() { [] }\nfn add(acc, r) { acc + [r.n] }",
        emits: r#"{"key":"u","value":[1]}, {"key":"u","value":[1,2]}, {"key":"u","value":[1,2,3]}"#,
    },
    EntryPoint {
        operator: "aggregate",
        name: "finish",
        params: &["acc"],
        required: false,
        meaning: "Turns the accumulator into the output value (without it the accumulator is \
                  the output).",
        errors: FAILS_RECORD,
        example: "fn init() { #{sum: 0, count: 0} }\n\
                  fn add(acc, r) { #{sum: acc.sum + r.n, count: acc.count + 1} }\n\
                  fn finish(acc) { acc.sum / acc.count }",
        emits: r#"{"key":"u","value":1}, {"key":"u","value":1}, {"key":"u","value":2}"#,
    },
    EntryPoint {
        operator: "process",
        name: "process",
        params: &["r"],
        required: true,
        meaning: "Handles `r` with the key's named state (`state_*`, `list_*`, `map_*`) and \
                  sends records with `emit`; the return value is ignored.",
        errors: FAILS_RECORD,
        example: "fn process(r) { list_push(\"seen\", r.n); emit(#{seen: list_len(\"seen\")}); }",
        emits: r#"{"seen":1}, {"seen":2}, {"seen":3}"#,
    },
    EntryPoint {
        operator: "process",
        name: "on_end",
        params: &["key"],
        required: false,
        meaning: "Called once per key holding state when a bounded input ends; may read the \
                  key's state and `emit`.",
        errors: "As `process`; the record in the error is the key.",
        example: "fn process(r) { list_push(\"seen\", r.n); }\n\
                  fn on_end(key) { emit(#{key: key, all: list_get(\"seen\")}); }",
        emits: r#"{"all":[1,2,3],"key":"u"}"#,
    },
    EntryPoint {
        operator: "process",
        name: "on_timer",
        params: &["ts", "kind"],
        required: false,
        meaning: "Called when a timer the script set fires: `ts` is its time, `kind` is \
                  `\"event\"` (the watermark reached `ts`) or `\"processing\"` (the wall clock \
                  did). The timer's key is current: `key()`, the state functions and `emit` work \
                  as in `process`, and it may set further timers. Event-time timers fire in \
                  time order; timers restored from a checkpoint that are already due fire at \
                  the next watermark or wake-up.",
        errors: "As `process`; the record in the error is `{key, timer, kind}`.",
        example: "fn process(r) { list_push(\"seen\", r.n); register_event_timer(100); }\n\
                  fn on_timer(ts, kind) { emit(#{key: key(), at: ts, kind: kind, \
                  seen: list_get(\"seen\")}); }",
        emits: r#"{"at":100,"key":"u","kind":"event","seen":[1,2,3]}"#,
    },
    EntryPoint {
        operator: "window",
        name: "init",
        params: &[],
        required: true,
        meaning: "Returns the empty accumulator of a new window of a key (a scripted window, \
                  without `aggregations:`). Each window of each key has its own.",
        errors: FAILS_RECORD,
        example: "fn init() { 0 }\nfn add(acc, r) { acc + r.n }",
        emits: r#"{"key":"u","value":6,"window_end":1700000040000,"window_start":1699999980000}"#,
    },
    EntryPoint {
        operator: "window",
        name: "add",
        params: &["acc", "r"],
        required: true,
        meaning: "Adds `r` to the accumulator of one of its windows and returns it (a record \
                  in several sliding windows is added to each).",
        errors: FAILS_RECORD,
        example: "fn init() { [] }\nfn add(acc, r) { acc + [r.n] }",
        emits: r#"{"key":"u","value":[1,2,3],"window_end":1700000040000,"window_start":1699999980000}"#,
    },
    EntryPoint {
        operator: "window",
        name: "finish",
        params: &["acc"],
        required: false,
        meaning: "Turns a window's accumulator into its output when the window emits; a map \
                  gets `window_start` and `window_end` added (without `finish` the \
                  accumulator is the output).",
        errors: FAILS_RECORD,
        example: "fn init() { #{sum: 0, count: 0} }\n\
                  fn add(acc, r) { #{sum: acc.sum + r.n, count: acc.count + 1} }\n\
                  fn finish(acc) { #{mean: acc.sum / acc.count} }",
        emits: r#"{"key":"u","mean":2,"window_end":1700000040000,"window_start":1699999980000}"#,
    },
    EntryPoint {
        operator: "window",
        name: "merge",
        params: &["a", "b"],
        required: false,
        meaning: "Session windows only, and required there: combines the accumulators of two \
                  sessions that a record bridges into one.",
        errors: FAILS_RECORD,
        example: "fn init() { 0 }\nfn add(acc, r) { acc + r.n }\nfn merge(a, b) { a + b }",
        emits: r#"{"key":"u","value":6,"window_end":1700000060000,"window_start":1700000000000}"#,
    },
    EntryPoint {
        operator: "reduce, aggregate, process, window",
        name: "migrate",
        params: &["old"],
        required: false,
        meaning: "On a restore from a savepoint or checkpoint, called once per stored value \
                  (accumulator or state entry; in a `window`, each open window's accumulator) \
                  with the old value; returns the new one, or `()` to delete it (a window: \
                  drop that window). A `migrate(name, old)` form also receives the state's \
                  name (`windows` in a window); the one-parameter form wins when both are \
                  defined.",
        errors: "A failure stops the restore, naming the state and the value.",
        example: "fn reduce(acc, r) { #{n: acc.n + r.n} }\nfn migrate(old) { #{n: old.n * 10} }",
        emits: "",
    },
];

/// The signature of a function: `name(a, b)`.
fn signature(name: &str, params: &[&str]) -> String {
    format!("{name}({})", params.join(", "))
}

/// `docs/SCRIPT_API.md`.
pub fn render_markdown() -> String {
    let mut out = String::from(
        "<!-- Generated from engine/src/script/api.rs: do not edit. Regenerate with\n     \
         WEIR_BLESS=1 cargo test -p weir-engine --release script_api -->\n\
         # Weir script API\n\n\
         Scripts are [Rhai](https://rhai.rs/book/) with its standard library (strings, arrays, \
         maps, math), sandboxed by the pipeline's `limits:`; `print(x)` and `debug(x)` write \
         log lines, never to stdout. This page lists \
         what Weir adds: the functions a script defines for its operator \
         ([entry points](#entry-points)) and the functions Weir provides \
         ([functions](#functions)). Every example below is run by the test suite.\n\n\
         ## Entry points\n\n\
         | Operator | Function | Required | Meaning |\n|---|---|---|---|\n",
    );
    for e in ENTRY_POINTS {
        out.push_str(&format!(
            "| `{}` | [`fn {}`](#{}) | {} | {} |\n",
            e.operator,
            signature(e.name, e.params),
            anchor(&format!("fn {}", signature(e.name, e.params))),
            if e.required { "yes" } else { "no" },
            first_sentence(e.meaning),
        ));
    }
    for e in ENTRY_POINTS {
        out.push_str(&format!(
            "\n### fn {}\n\nOperator: `{}`{}.\n\n{}\n\n**Errors:** {}\n\n```rhai\n{}\n```\n",
            signature(e.name, e.params),
            e.operator,
            if e.required { "" } else { " (optional)" },
            e.meaning,
            e.errors,
            e.example,
        ));
        if !e.emits.is_empty() {
            out.push_str(&format!(
                "\nOn `{{n: 1}}`, `{{n: 2}}`, `{{n: 3}}` (key `\"u\"`) it outputs: `{}`\n",
                e.emits
            ));
        }
    }
    out.push_str(
        "\n## Functions\n\n\
         State functions work on the current record's key in the states the operator declares \
         (`state: {count: value, seen: list, by: map}`); the examples run in such a `process` \
         operator on the records `1`, `2`, `3` of key `\"u\"`, with the processing-time clock \
         at `1700000000000`; then the clock moves on a minute and the input ends (the \
         watermark reaches the end of time). A state declared with a time-to-live \
         (`seen: {kind: list, ttl: 1h}`) reads as absent once it expired.\n\n\
         | Function | Returns | Operators | Meaning |\n|---|---|---|---|\n",
    );
    for f in HOST_FUNCTIONS {
        out.push_str(&format!(
            "| [`{}`](#{}) | `{}` | {} | {} |\n",
            signature(f.name, f.params),
            anchor(f.name),
            f.returns,
            f.operators
                .iter()
                .map(|o| format!("`{o}`"))
                .collect::<Vec<_>>()
                .join(", "),
            first_sentence(f.meaning),
        ));
    }
    for f in HOST_FUNCTIONS {
        out.push_str(&format!(
            "\n### {}\n\n`{} -> {}`\n\n{}\n\n**Errors:** {}\n\n```rhai\n{}\n```\n\nEmits: `{}`\n",
            f.name,
            signature(f.name, f.params),
            f.returns,
            f.meaning,
            f.errors,
            f.example,
            f.emits,
        ));
    }
    out.push_str(NATIVE);
    out
}

/// The section on native execution (`script::fast`, `script::native`).
const NATIVE: &str = "\n## Native execution\n\n\
Weir runs common script bodies without Rhai's evaluator, with the same results: a body is \
compiled once per operator, and on each record the native run either does exactly what Rhai \
would or gives up before anything is visible, and the record runs through Rhai. Differential \
tests compare both on random records and state.\n\n\
- **One-expression bodies** (`map`, `filter`, `key_by`, `reduce`, ...): literals, the \
parameters and their properties, `+ - * / %` on ints, `+` on strings, comparisons, `!`, \
`&&`, `||` and map literals; in `reduce`-style bodies also leading assignments to the \
parameters' properties, `if` expressions and `\"field\" in map`.\n\
- **`process` (and `on_end`) bodies of statements**: `let` locals, assignment (`x = v`, `x += v` and the \
other arithmetic assignments, `a[i] = v`, `m[k] = v`, `m.k = v` on locals), `if`/`else` as \
statement and expression, `for x in array`, `for i in a..b` and `a..=b`, `while`, `break`, \
`continue`, `return`; array literals and `push`, `pop`, `len`, `sort()` and \
`sort(|a, b| expr)` (the comparator answering with an int's sign or a bool, as Rhai's `sort` \
reads it); map literals, properties and indexing; `${..}` interpolation of ints and strings; \
int arithmetic with Rhai's overflow and division rules, comparisons, `== ()` and `!= ()`; \
and `state_get`, `state_set`, `state_clear`, `state_add`, `list_get`, `list_push`, \
`list_len`, `list_set`, `list_top`, `map_get`, `map_put`, `map_add`, `map_remove`, \
`map_len`, `emit` and `key()` with the state's name written as a string literal. A native \
run buffers its state writes and emitted records (its own reads see them) and applies them \
when the body completes.\n\n\
A record is handed to Rhai, before any effect, on anything Rhai might treat otherwise: a \
value of another type (floats, chars, timestamps, ...), a missing property or index, a \
negative index, an integer overflow or a division by zero, a type mix, a size limit of \
`limits:` reached, a state write the state functions would refuse, an `emit` beyond \
`limits.max_outputs_per_record`, a comparator answering anything but an int or a bool, an \
operation count that could reach `limits.max_operations`, an undeclared state, or a state \
with a `ttl`. A body using anything else (other functions, `print`, timers, `now()`, \
`watermark()`, `try`/`catch`, `throw`, `switch`, `const`, closures other than a sort \
comparator, floats, chars, a state name that is not a literal), or whose script defines a \
function named like one it calls, always runs in Rhai. `on_end` bodies run natively on the \
same terms as `process` bodies; `on_timer` and `migrate` always run in Rhai.\n";

/// The first sentence of a text, for summary tables.
fn first_sentence(text: &str) -> &str {
    text.find(". ").map_or(text, |i| &text[..=i])
}

/// GitHub's anchor for a heading.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => Some(c),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use rhai::Dynamic;
    use weir_schema::{EmitMode, ScriptLimitsSpec, StateKind};

    use super::*;
    use crate::base::message::Batch;
    use crate::element::{Harness, Operator};
    use crate::operators::reduce::tests::{key, keyed_ctx, script};
    use crate::record::excerpt;

    /// `(name, arity)` of every function the runtime engine has beyond Rhai's own.
    fn registered() -> BTreeSet<(String, usize)> {
        let engine = crate::script::runtime::runtime_engine(&ScriptLimitsSpec::default());
        engine
            .gen_fn_signatures(false)
            .into_iter()
            // The strict operators (`+`, `==`, ...) that reject mixed types are not functions
            // a script calls by name; the README's strict data errors section covers them.
            .filter(|sig| {
                sig.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            })
            .map(|sig| {
                let name = sig[..sig.find('(').expect("a signature")].to_owned();
                let params = &sig[sig.find('(').expect("(") + 1..sig.rfind(')').expect(")")];
                let arity = if params.trim().is_empty() {
                    0
                } else {
                    params.split(',').count()
                };
                (name, arity)
            })
            .collect()
    }

    #[test]
    fn script_api_table_matches_the_registered_functions() {
        let documented: BTreeSet<(String, usize)> = HOST_FUNCTIONS
            .iter()
            .map(|f| (f.name.to_owned(), f.params.len()))
            .collect();
        let registered = registered();
        let undocumented: Vec<_> = registered.difference(&documented).collect();
        let missing: Vec<_> = documented.difference(&registered).collect();
        assert!(
            undocumented.is_empty(),
            "registered but not in HOST_FUNCTIONS (engine/src/script/api.rs): {undocumented:?}"
        );
        assert!(
            missing.is_empty(),
            "in HOST_FUNCTIONS but not registered: {missing:?}"
        );
    }

    #[test]
    fn script_api_entry_points_match_the_operators() {
        // Every function an operator requires (schema registry) is an entry point.
        for (operator, name, arity) in [
            ("map", "map", 1),
            ("filter", "filter", 1),
            ("flat_map", "flat_map", 1),
            ("key_by", "key", 1),
            ("reduce", "reduce", 2),
            ("aggregate", "init", 0),
            ("aggregate", "add", 2),
            ("process", "process", 1),
        ] {
            assert!(
                ENTRY_POINTS.iter().any(|e| e.operator == operator
                    && e.name == name
                    && e.params.len() == arity
                    && e.required),
                "{operator}: fn {name} with {arity} parameters"
            );
        }
        let spec = |yaml: &str| -> weir_schema::OperatorSpec {
            serde_json::from_value(serde_json::from_str(yaml).expect("json")).expect("spec")
        };
        let required: BTreeSet<(&str, usize)> = [
            r#"{"type":"map","id":"a","script":"x"}"#,
            r#"{"type":"filter","id":"a","script":"x"}"#,
            r#"{"type":"flat_map","id":"a","script":"x"}"#,
            r#"{"type":"key_by","id":"a","script":"x"}"#,
            r#"{"type":"reduce","id":"a","script":"x"}"#,
            r#"{"type":"aggregate","id":"a","script":"x"}"#,
            r#"{"type":"process","id":"a","script":"x"}"#,
        ]
        .iter()
        .flat_map(|y| spec(y).required_functions().iter().copied())
        .collect();
        let documented: BTreeSet<(&str, usize)> = ENTRY_POINTS
            .iter()
            .filter(|e| e.required)
            .map(|e| (e.name, e.params.len()))
            .collect();
        assert_eq!(required, documented);
    }

    fn declared() -> Vec<(String, StateKind)> {
        vec![
            ("count".to_owned(), StateKind::Value),
            ("seen".to_owned(), StateKind::List),
            ("by".to_owned(), StateKind::Map),
        ]
    }

    fn keyed(records: Vec<Dynamic>) -> Batch {
        Batch {
            times: Vec::new(),
            keys: records.iter().map(|_| key("u")).collect(),
            records,
        }
    }

    fn shown(out: &[Dynamic]) -> String {
        out.iter().map(excerpt).collect::<Vec<_>>().join(", ")
    }

    /// Processing time when the examples run (epoch milliseconds).
    const NOW: i64 = 1_700_000_000_000;

    /// Runs `op` on `records` one batch per record with the clock at [`NOW`], then moves the
    /// clock on a minute (processing-time timers fire), and ends the input as the task loop
    /// does (the watermark reaches the end, then `on_end`).
    fn run(op: Box<dyn Operator>, records: &[Dynamic], keyed_input: bool) -> String {
        let mut ctx = keyed_ctx();
        ctx.clock = crate::base::clock::Clock::manual(NOW);
        let clock = ctx.clock.clone();
        let mut h = Harness::new(op, ctx).expect("opens");
        let mut out = Vec::new();
        for r in records {
            let batch = if keyed_input {
                keyed(vec![r.clone()])
            } else {
                Batch {
                    times: Vec::new(),
                    records: vec![r.clone()],
                    keys: Vec::new(),
                }
            };
            out.extend(h.push(batch).expect("runs").records);
        }
        clock.advance(60_000);
        let now = clock.now_ms();
        if h.operator.next_processing_time().is_some_and(|t| t <= now) {
            h.operator
                .on_processing_time(now, &mut out, &mut h.ctx)
                .expect("timers");
        }
        let end = crate::base::message::WATERMARK_END;
        h.ctx.watermark = end;
        h.operator
            .on_watermark(end, &mut out, &mut h.ctx)
            .expect("watermark");
        assert_eq!(h.ctx.errors, 0, "the example fails a record");
        out.extend(h.finish().expect("ends"));
        shown(&out)
    }

    #[test]
    fn script_api_function_examples_emit_what_they_say() {
        let ints: Vec<Dynamic> = (1..=3_i64).map(Dynamic::from).collect();
        for f in HOST_FUNCTIONS {
            let op = crate::operators::process::ProcessOperator::new(
                script(f.example),
                declared(),
                10,
            );
            assert_eq!(run(Box::new(op), &ints, true), f.emits, "{}", f.name);
        }
    }

    #[test]
    fn script_api_entry_point_examples_output_what_they_say() {
        use crate::operators::{aggregate, filter, flat_map, map, process, reduce};
        let records: Vec<Dynamic> = (1..=3_i64)
            .map(|n| {
                let mut m = rhai::Map::new();
                m.insert("n".into(), Dynamic::from(n));
                Dynamic::from_map(m)
            })
            .collect();
        for e in ENTRY_POINTS {
            let s = || script(e.example);
            let (op, keyed_input): (Box<dyn Operator>, bool) = match (e.operator, e.name) {
                ("map", _) => (Box::new(map::MapOperator::new(s())), false),
                ("filter", _) => (Box::new(filter::FilterOperator::new(s())), false),
                ("flat_map", _) => (Box::new(flat_map::FlatMapOperator::new(s(), 10)), false),
                ("reduce", _) => (
                    Box::new(reduce::ReduceOperator::new(
                        s(),
                        EmitMode::Updates,
                        "key".to_owned(),
                    )),
                    true,
                ),
                ("aggregate", _) => (
                    Box::new(aggregate::AggregateOperator::scripted(
                        s(),
                        EmitMode::Updates,
                        "key".to_owned(),
                    )),
                    true,
                ),
                ("process", _) => (
                    Box::new(process::ProcessOperator::new(s(), declared(), 10)),
                    true,
                ),
                ("key_by", _) => {
                    let mut f = s();
                    let keys: Vec<String> = records
                        .iter()
                        .map(|r| excerpt(&f.call("key", (r.clone(),)).expect("key")))
                        .collect();
                    assert_eq!(keys.join(", "), e.emits, "fn key");
                    continue;
                }
                ("window", name) => {
                    // Processing-time windows of one minute (sessions with a one-minute gap
                    // for `merge`): the three records share one, which closes when the
                    // example's clock moves on.
                    use crate::operators::window::{Assigner, WindowConfig, WindowOperator, WindowTime};
                    let assigner = if name == "merge" {
                        Assigner::Session { gap: 60_000 }
                    } else {
                        Assigner::Tumbling { size: 60_000 }
                    };
                    let config = WindowConfig {
                        carried_times: false,
                        assigner,
                        time: WindowTime::Processing,
                        allowed_lateness: 0,
                        emit: weir_schema::WindowEmitSpec::OnClose,
                        key_field: "key".to_owned(),
                        late_output: false,
                        heap: false,
                        shape: None,
                    };
                    (
                        Box::new(WindowOperator::new(aggregate::Accumulator::scripted(s()), config)),
                        true,
                    )
                }
                (_, "migrate") => {
                    let f = s();
                    assert!(f.defines("migrate", 1), "{}", e.example);
                    continue;
                }
                other => panic!("no runner for {other:?}"),
            };
            assert_eq!(
                run(op, &records, keyed_input),
                e.emits,
                "fn {} of {}",
                e.name,
                e.operator
            );
        }
    }

    #[test]
    fn script_api_docs_are_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SCRIPT_API.md");
        let generated = render_markdown();
        if std::env::var_os("WEIR_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write docs/SCRIPT_API.md");
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "docs/SCRIPT_API.md is stale: run \
             `WEIR_BLESS=1 cargo test -p weir-engine --release script_api` and commit it"
        );
    }
}
