//! A session's `budget`: a hard spend ceiling in USD cents (`{"type": "limit",
//! "max_list_cost": {"amount": "2500", "currency": "USD"}}`), enforced with the engine's
//! per-execution cap: each turn runs with what is left of the session's budget as its own
//! cap, so the engine stops it at its next model request once it is spent; a held turn whose
//! session is over its budget is withdrawn rather than waiting on results; a turn is not
//! started on a spent budget. The session's spend is the metered cost of its turns at the
//! model's `[[models]] price` (`usage.list_cost`), kept in whole cents rounded up, so the cap
//! fires at or before the true cost. Only a priced model can be budgeted
//! (`model_not_budgetable`).

use serde_json::{json, Value};

use super::refused;
use crate::error::ApiError;

/// Nano-USD in one US cent.
const NANOS_PER_CENT: u64 = 10_000_000;

/// A budget as the client sent it, read as its ceiling in nano-USD.
pub(super) fn parse(field: &str, v: &Value) -> Result<u64, ApiError> {
    if v["type"] != "limit" {
        return Err(refused(format!("{field}.type"), "must be `limit`"));
    }
    let cost = &v["max_list_cost"];
    if cost["currency"] != "USD" {
        return Err(refused(
            format!("{field}.max_list_cost.currency"),
            "must be `USD`",
        ));
    }
    let amount = cost["amount"].as_str().unwrap_or_default();
    let digits = !amount.is_empty() && amount.bytes().all(|b| b.is_ascii_digit());
    let cents = match amount.parse::<u64>() {
        Ok(c) if digits && c > 0 && !amount.starts_with('0') => c,
        _ => {
            return Err(refused(
                format!("{field}.max_list_cost.amount"),
                "must be a positive whole number of cents, as a string without leading zeros",
            ))
        }
    };
    cents
        .checked_mul(NANOS_PER_CENT)
        .ok_or_else(|| refused(format!("{field}.max_list_cost.amount"), "is too large"))
}

/// The session's ceiling in nano-USD, if it has a budget.
pub(super) fn ceiling(session: &Value) -> Option<u64> {
    parse("budget", &session["budget"]).ok()
}

/// A cost in nano-USD as the API's monetary amount (cents, rounded up).
pub(super) fn amount(nanos: u64) -> Value {
    let cents = nanos.div_ceil(NANOS_PER_CENT);
    json!({"amount": cents.to_string(), "currency": "USD"})
}

/// What `usage.list_cost` says the session has spent, in nano-USD.
pub(super) fn spent(session: &Value) -> u64 {
    let cents = session["usage"]["list_cost"]["amount"].as_str();
    let cents = cents.and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
    cents.saturating_mul(NANOS_PER_CENT)
}

/// A session update's `budget`: replaced (never to at or below what is spent) or removed
/// (`null`); one can be neither added to a session created without one nor re-added.
pub(super) fn update(session: &mut Value, given: &Value) -> Result<(), ApiError> {
    if session["budget"].is_null() {
        return match given {
            Value::Null => Ok(()),
            _ => Err(refused(
                "budget",
                "can only be changed on a session created with one (budget_create_only)",
            )),
        };
    }
    if given.is_null() {
        session["budget"] = Value::Null;
        return Ok(());
    }
    let ceiling = parse("budget", given)?;
    if ceiling <= spent(session) {
        return Err(refused(
            "budget",
            "must be above what the session has spent (budget_not_raised)",
        ));
    }
    session["budget"] = json!({"type": "limit", "max_list_cost": amount(ceiling)});
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(amount: &str) -> Value {
        json!({"type": "limit", "max_list_cost": {"amount": amount, "currency": "USD"}})
    }

    #[test]
    fn amounts_are_whole_cents_without_leading_zeros() {
        assert_eq!(parse("budget", &limit("2500")).unwrap(), 25_000_000_000);
        for bad in ["0", "007", "", "1.5", "-3", "99999999999999999999"] {
            assert!(parse("budget", &limit(bad)).is_err(), "{bad}");
        }
        let eur = json!({"type": "limit", "max_list_cost": {"amount": "1", "currency": "EUR"}});
        let e = parse("budget", &eur).unwrap_err();
        assert!(
            e.message.contains("`budget.max_list_cost.currency`"),
            "{e:?}"
        );
    }

    #[test]
    fn spend_rounds_up_to_the_cent_and_reads_back() {
        assert_eq!(amount(0)["amount"], "0");
        assert_eq!(amount(1)["amount"], "1");
        assert_eq!(amount(NANOS_PER_CENT)["amount"], "1");
        assert_eq!(amount(NANOS_PER_CENT + 1)["amount"], "2");
        let session = json!({"usage": {"list_cost": amount(3 * NANOS_PER_CENT)}});
        assert_eq!(spent(&session), 3 * NANOS_PER_CENT);
    }

    #[test]
    fn updates_replace_above_the_spend_or_remove_and_never_add() {
        let mut none = json!({"budget": null});
        assert!(update(&mut none, &limit("100")).is_err());
        assert!(update(&mut none, &Value::Null).is_ok());
        let mut s =
            json!({"budget": limit("100"), "usage": {"list_cost": amount(50 * NANOS_PER_CENT)}});
        let e = update(&mut s, &limit("50")).unwrap_err();
        assert!(e.message.contains("budget_not_raised"), "{e:?}");
        update(&mut s, &limit("200")).unwrap();
        assert_eq!(ceiling(&s), Some(200 * NANOS_PER_CENT));
        update(&mut s, &Value::Null).unwrap();
        assert_eq!(ceiling(&s), None);
        assert!(
            update(&mut s, &limit("300")).is_err(),
            "a removed budget is not re-added"
        );
    }
}
