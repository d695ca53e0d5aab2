//! Token usage in the store: one row per UTC day, principal and model, with the totals the
//! backends reported. Rows are added to, never rewritten: the engine's ledger folds its
//! in-memory deltas in with one upsert per key.

use super::announce::{Change, ChangeKind, Crossed};
use super::db::{vals, Tx, Val};
use super::{Store, StoreError};
use crate::auth::grant::GROUP_PREFIX;
use crate::turn::Usage;

/// Totals of one day, principal and model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// Days since 1970-01-01 (UTC).
    pub day: u32,
    pub principal: String,
    pub model: String,
    pub usage: Usage,
    /// Model requests reported.
    pub requests: u64,
    /// What they cost at the model's price when reported, in nano-USD.
    pub spend: u64,
}

/// A principal's totals since a day: that day's alone and all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageTotals {
    pub tokens_today: u64,
    pub spend_today: u64,
    pub spend_since: u64,
}

/// The principals whose caps a usage write watches: their totals on `today` and since
/// `since` are read back in the write's transaction, and `crossed` says, from the totals
/// before and after, which thresholds the write crossed (each an outbox row).
pub struct Watch<'a> {
    pub principals: Vec<&'a str>,
    pub since: u32,
    pub today: u32,
    #[allow(clippy::type_complexity)]
    pub crossed:
        &'a (dyn for<'p> Fn(&'p str, &UsageTotals, &UsageTotals) -> Vec<Crossed<'p>> + Sync),
}

/// Which rows to read; `None` is unbounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    pub principal: Option<String>,
    pub from_day: Option<u32>,
    pub to_day: Option<u32>,
}

/// A count as the store's signed 64-bit integer: saturated, never wrapped negative (counts
/// saturate at `u64::MAX`).
fn db(n: u64) -> u64 {
    n.min(i64::MAX as u64)
}

async fn add(t: &mut Tx<'_>, r: &UsageRow) -> Result<u64, StoreError> {
    let u = &r.usage;
    t.exec(
        "INSERT INTO usage_daily (day, principal, model, input_tokens, cached_input_tokens,
                                  output_tokens, reasoning_tokens, requests, cache_write_tokens,
                                  spend_nanousd)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (day, principal, model) DO UPDATE SET
           input_tokens = usage_daily.input_tokens + excluded.input_tokens,
           cached_input_tokens = usage_daily.cached_input_tokens + excluded.cached_input_tokens,
           output_tokens = usage_daily.output_tokens + excluded.output_tokens,
           reasoning_tokens = usage_daily.reasoning_tokens + excluded.reasoning_tokens,
           requests = usage_daily.requests + excluded.requests,
           cache_write_tokens = usage_daily.cache_write_tokens + excluded.cache_write_tokens,
           spend_nanousd = usage_daily.spend_nanousd + excluded.spend_nanousd",
        vals![
            r.day,
            &r.principal,
            &r.model,
            db(u.prompt_tokens),
            db(u.cached_tokens),
            db(u.completion_tokens),
            db(u.reasoning_tokens),
            db(r.requests),
            db(u.cache_write_tokens),
            db(r.spend)
        ],
    )
    .await
}

impl Store {
    /// Adds these deltas to the daily totals, in one transaction, with the thresholds they
    /// crossed of the watched principals' caps (only while an endpoint subscribes).
    pub async fn usage_added(
        &self,
        rows: &[UsageRow],
        watch: Option<&Watch<'_>>,
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let watch =
            watch.filter(|w| !w.principals.is_empty() && self.announces(ChangeKind::Budget));
        let Some(w) = watch else {
            return self
                .db
                .tx(async |t| {
                    for r in rows {
                        add(t, r).await?;
                    }
                    Ok(())
                })
                .await;
        };
        self.announcing(async |t| {
            for r in rows {
                add(t, r).await?;
            }
            for principal in &w.principals {
                // Read back after the write (a concurrent replica's committed rows count):
                // what was there before is that less this write's own rows.
                let after = totals(t, principal, w.since, w.today).await?;
                let own = own_totals(rows, principal, w.since, w.today);
                let before = UsageTotals {
                    tokens_today: after.tokens_today.saturating_sub(own.tokens_today),
                    spend_today: after.spend_today.saturating_sub(own.spend_today),
                    spend_since: after.spend_since.saturating_sub(own.spend_since),
                };
                for c in (w.crossed)(principal, &before, &after) {
                    let write = self.announce(t, &Change::Budget(c));
                    write.await?;
                }
            }
            Ok(())
        })
        .await
    }

    /// Daily totals, oldest day first, then by principal and model.
    pub async fn usage(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, StoreError> {
        let mut sql = String::from(
            "SELECT day, principal, model, input_tokens, cached_input_tokens, output_tokens,
                    reasoning_tokens, requests, cache_write_tokens, spend_nanousd
             FROM usage_daily WHERE 1 = 1",
        );
        let mut params: Vec<Val<'_>> = Vec::new();
        for (clause, v) in [
            ("principal =", q.principal.as_deref().map(Val::T)),
            ("day >=", q.from_day.map(|d| Val::I(d.into()))),
            ("day <=", q.to_day.map(|d| Val::I(d.into()))),
        ] {
            if let Some(v) = v {
                params.push(v);
                sql.push_str(&format!(" AND {clause} ?{}", params.len()));
            }
        }
        // A group budget's pooled rows repeat its members' usage: listed only when asked for.
        if q.principal.is_none() {
            sql.push_str(&format!(" AND principal NOT LIKE '{GROUP_PREFIX}%'"));
        }
        sql.push_str(" ORDER BY day, principal, model");
        let rows = self.db.read(async |t| t.rows(&sql, &params).await).await?;
        rows.iter()
            .map(|r| {
                let n = |i: usize| r.i(i).map(|v| v as u64);
                Ok(UsageRow {
                    day: r.i(0)? as u32,
                    principal: r.t(1)?,
                    model: r.t(2)?,
                    usage: Usage {
                        prompt_tokens: n(3)?,
                        cached_tokens: n(4)?,
                        completion_tokens: n(5)?,
                        reasoning_tokens: n(6)?,
                        total_tokens: n(3)? + n(5)?,
                        cache_write_tokens: n(8)?,
                    },
                    requests: n(7)?,
                    spend: n(9)?,
                })
            })
            .collect()
    }
}

impl Store {
    /// The principal's tokens and spend on `today` and its spend from `since` to `today`
    /// (the windows of its daily and monthly caps): one read.
    pub async fn usage_totals(
        &self,
        principal: &str,
        since: u32,
        today: u32,
    ) -> Result<UsageTotals, StoreError> {
        self.db
            .read(async |t| totals(t, principal, since, today).await)
            .await
    }
}

async fn totals(
    t: &mut Tx<'_>,
    principal: &str,
    since: u32,
    today: u32,
) -> Result<UsageTotals, StoreError> {
    let rows = t
        .rows(
            "SELECT day, CAST(SUM(input_tokens + output_tokens) AS BIGINT),
                    CAST(SUM(spend_nanousd) AS BIGINT) FROM usage_daily
             WHERE principal = ?1 AND day >= ?2 AND day <= ?3 GROUP BY day",
            vals![principal, since, today],
        )
        .await?;
    let mut totals = UsageTotals::default();
    for r in &rows {
        let (day, tokens, spend) = (r.i(0)?, r.i(1)? as u64, r.i(2)? as u64);
        if day == i64::from(today) {
            totals.tokens_today += tokens;
            totals.spend_today += spend;
        }
        totals.spend_since += spend;
    }
    Ok(totals)
}

/// What `rows` add to the principal's totals (the same sums as [`totals`]).
fn own_totals(rows: &[UsageRow], principal: &str, since: u32, today: u32) -> UsageTotals {
    let mut t = UsageTotals::default();
    for r in rows
        .iter()
        .filter(|r| r.principal == principal && (since..=today).contains(&r.day))
    {
        let (tokens, spend) = (
            db(r.usage.prompt_tokens) + db(r.usage.completion_tokens),
            db(r.spend),
        );
        if r.day == today {
            t.tokens_today = t.tokens_today.saturating_add(tokens);
            t.spend_today = t.spend_today.saturating_add(spend);
        }
        t.spend_since = t.spend_since.saturating_add(spend);
    }
    t
}

/// Days since 1970-01-01 of a Unix time (UTC).
pub fn day_of(unix_secs: u64) -> u32 {
    (unix_secs / 86_400) as u32
}

/// The (year, month, day) of a day number (the proleptic Gregorian calendar, UTC).
pub fn civil_of(day: u32) -> (i64, u32, u32) {
    // Civil-from-days over 400-year eras (H. Hinnant's algorithm); a date formatter and the
    // first of a month are all this needs of a calendar crate.
    let z = day as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m as u32, d as u32)
}

/// The day number of a date (days from civil; the inverse of [`civil_of`] for valid dates).
pub fn day_of_civil(y: i64, m: u32, d: u32) -> u32 {
    let (m, d) = (i64::from(m), i64::from(d));
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468).max(0) as u32
}

/// `YYYY-MM-DD` of a day number (UTC).
pub fn date_of(day: u32) -> String {
    let (y, m, d) = civil_of(day);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day number of a `YYYY-MM-DD` date, or None if it is not one.
pub fn day_from_date(s: &str) -> Option<u32> {
    let mut parts = s.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, u32, u32) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let day = day_of_civil(y, m, d);
    // Reject dates like 2026-02-31 that normalise to another day.
    (date_of(day) == s).then_some(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dates_round_trip() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(day_of(1_796_083_200)), "2026-12-01");
        assert_eq!(day_from_date("2026-12-01"), Some(day_of(1_796_083_200)));
        assert_eq!(
            day_from_date("2024-02-29").map(date_of).as_deref(),
            Some("2024-02-29")
        );
        for bad in ["2026-02-31", "2026-13-01", "26-12-01", "2026-1-01", "x"] {
            assert_eq!(day_from_date(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn deltas_add_up_per_day_principal_and_model() {
        let s = Store::open_in_memory().await.unwrap();
        let row = |day, p: &str, input| UsageRow {
            day,
            principal: p.into(),
            model: "m".into(),
            usage: Usage {
                prompt_tokens: input,
                completion_tokens: 2,
                cached_tokens: 1,
                cache_write_tokens: 1,
                reasoning_tokens: 1,
                total_tokens: input + 2,
            },
            requests: 1,
            spend: 7,
        };
        s.usage_added(&[row(5, "alice", 10), row(5, "bob", 1)], None)
            .await
            .unwrap();
        s.usage_added(&[row(5, "alice", 20), row(6, "alice", 3)], None)
            .await
            .unwrap();
        let alice = UsageQuery {
            principal: Some("alice".into()),
            ..Default::default()
        };
        let rows = s.usage(&alice).await.unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].usage.prompt_tokens, rows[0].requests), (30, 2));
        assert_eq!(rows[0].usage.completion_tokens, 4);
        let day6 = UsageQuery {
            from_day: Some(6),
            ..Default::default()
        };
        assert_eq!(s.usage(&day6).await.unwrap().len(), 1);
        assert_eq!(s.usage(&UsageQuery::default()).await.unwrap().len(), 3);
        assert_eq!(rows[0].spend, 14);
        let t = s.usage_totals("alice", 5, 6).await.unwrap();
        assert_eq!((t.tokens_today, t.spend_today, t.spend_since), (5, 7, 21));
    }
}
