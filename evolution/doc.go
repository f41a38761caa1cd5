// Package evolution decides whether an agent's proposed self-modification is
// promoted, and remembers the promotions so they survive a crash.
//
// It holds the pure parts of an evolution trial; starting, feeding and
// stopping the shadow agent is package supervisor's job. The flow, as an
// operator sees it (docs/evolution.md has the whole story):
//
//  1. The primary agent sends evolution_intent. The newest checkpoint becomes
//     the pinned backup; a shadow agent is restored from it and hot-reloaded
//     with the new code.
//  2. For the trial's duration every request goes to both agents, and each
//     agent's metrics reports go into a [Collector] under its [Side].
//  3. At the end, [Decide] compares the two [Summary] values, taking into
//     account what happened to the shadow ([Outcome]) and the operator's
//     [Thresholds], and returns a [Decision] for evolution_result and the
//     audit log.
//  4. On promotion the supervisor records a [Promotion] in the [Ledger]
//     before it hot-reloads the primary, and after every restore it re-sends
//     what [Ledger.Since] returns.
//
// # The comparison
//
// From the means of each side's reports:
//
//	latency_improvement = shadow avg_latency ÷ primary avg_latency − 1   (negative is better)
//	error_rate_change   = shadow error_rate − primary error_rate
//	memory_increase     = shadow memory_usage ÷ primary memory_usage − 1
//
// The evolution is promoted only when every figure is at or below its limit
// (defaults +0.05, +0.01, +0.25: at most 5% slower, one percentage point more
// errors, 25% more memory) and the shadow stayed alive and heartbeating. A
// figure exactly at its limit is within it. Figures below zero are
// improvements and always within a non-negative limit.
//
// Anything that prevents a fair comparison rejects, with a reason naming it:
// a shadow that crashed, hung or stopped heartbeating (whatever its figures);
// fewer metrics reports than the minimum from either side; a compared key that
// one side never reported ("not enough data: shadow never reported
// memory_usage"); values no honest agent sends (NaN, ±Inf, negative latency
// or memory, an error rate outside 0..1); a primary figure of 0 against a
// shadow figure above 0, where the increase is unbounded. Both figures 0 is
// no change. The figures sent to the agent and audited are always finite
// numbers: one that cannot be computed is left out.
//
// Reports are averaged per key over the reports that carried it; a report
// without a key is not a zero. Keys other than avg_latency, error_rate and
// memory_usage do not take part.
//
// # The sequential judge
//
// A trial with mirrored requests is judged by a [Judge] instead: fed one
// [Pair] per request answered by the candidate and the control shadow, or
// answered by one of them and left unanswered by the other past its answer
// deadline (the silent one failed it: [Pairer.Expire]), asked
// for a [Verdict] after every pair, valid at every look (confidence
// sequences and e-values, one error budget 1 − --evolution-confidence; the
// Judge's doc comment says how it is split). It keeps constant memory, an
// update costs well under a microsecond, and its [Evidence] (estimates and
// bounds, and [Judge.Path] of them over the trial) is what
// evolution_result.metrics and the audit log show. [Decide] remains for a
// trial without any mirrored request, on the agents' own reports.
// sim_test.go simulates it; docs/evolution.md has the figures.
//
// # The ledger
//
// [Ledger] is a small JSON file, by convention DATA_DIR/evolution.json,
// written atomically (temporary file, fsync, rename, fsync of the directory)
// on every promotion. A missing file is an empty ledger; a corrupt one is an
// error wrapping [ErrCorruptLedger], never a guess. After a restore from a
// checkpoint, the newest promotion of each module made at or after the
// checkpoint's creation must be re-sent with hot_reload, since the restored
// state predates it; [Ledger.Since] returns exactly those.
package evolution
