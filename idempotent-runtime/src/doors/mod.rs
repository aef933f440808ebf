//! Doors other than HTTP: where duplicates come from besides an API's `POST`. Each door
//! runs the user's function through [`Idempotency::once`](crate::Idempotency::once), the
//! same protocol the HTTP handlers go through, and turns its [`Outcome`](crate::Outcome)
//! into the transport's answer by [`Outcome::disposition`](crate::Outcome::disposition),
//! the one rule every queue door follows.
//!
//! - [`nats`] (feature `nats`): a NATS JetStream pull consumer, keyed by `Nats-Msg-Id`.
//! - [`rabbitmq`] (feature `rabbitmq`): a RabbitMQ consumer, keyed by `message_id`.

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
