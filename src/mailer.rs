//! A fake mailer that sends payment receipts and refund notices: it counts what it sends,
//! and appends one line per mail to the demo's [`EffectsLog`] (`receipt_sent pay_… rcpt_…`,
//! `refund_notice_sent ch_… ntc_…`) when it has one.
//!
//! Like a real mail provider without an idempotency key, it sends a second receipt when
//! asked twice: only the payments handler's `receipt` step keeps a retried request from
//! mailing the customer again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::gateway::EffectsLog;

/// A receipt the mailer sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// `rcpt_…`, a new one for every receipt sent.
    pub id: String,
    /// The payment the receipt is for.
    pub payment: String,
}

/// The fake mailer; clones share one count and one log.
#[derive(Debug, Clone, Default)]
pub struct Mailer {
    sent: Arc<AtomicU64>,
    effects: EffectsLog,
}

impl Mailer {
    /// A mailer appending to `effects` (which may be no log at all).
    pub fn new(effects: EffectsLog) -> Self {
        Self {
            sent: Arc::default(),
            effects,
        }
    }

    /// Mails `account` a receipt for `payment`. Fails only when the effects log cannot be
    /// written (the receipt counts as sent then: the mail went out).
    pub async fn send_receipt(
        &self,
        account: &str,
        payment: &str,
    ) -> Result<Receipt, std::io::Error> {
        let receipt = Receipt {
            id: format!("rcpt_{:016x}", rand::rng().random::<u64>()),
            payment: payment.to_owned(),
        };
        self.sent.fetch_add(1, Ordering::SeqCst);
        tracing::info!(receipt = %receipt.id, %payment, %account, "receipt sent");
        self.effects
            .append(&format!("receipt_sent {payment} {}", receipt.id))?;
        Ok(receipt)
    }

    /// Mails `account` a notice that `charge` was refunded. Fails only when the effects
    /// log cannot be written (the notice counts as sent then).
    pub async fn send_refund_notice(
        &self,
        account: &str,
        charge: &str,
    ) -> Result<Receipt, std::io::Error> {
        let notice = Receipt {
            id: format!("ntc_{:016x}", rand::rng().random::<u64>()),
            payment: charge.to_owned(),
        };
        self.sent.fetch_add(1, Ordering::SeqCst);
        tracing::info!(notice = %notice.id, %charge, %account, "refund notice sent");
        self.effects
            .append(&format!("refund_notice_sent {charge} {}", notice.id))?;
        Ok(notice)
    }

    /// How many mails (receipts and refund notices) this process's mailer has sent.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}
