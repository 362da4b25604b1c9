//! One MQTT session, the way every fedge loop drives one: the client, its event loop and the
//! reconnect back-off as a timer. [`Session::next`] returns the next thing that happened; after
//! a failure it waits out the back-off *inside* the future it returns, so a `select!` over it
//! and a stop signal (or a training result) takes the other branch at once instead of
//! sleeping through it.

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, Publish};

use crate::{Backoff, describe_error};

/// What a session saw.
#[derive(Debug)]
pub enum SessionEvent {
    /// The broker accepted the connection (the first, or again after a loss).
    Connected,
    /// A message on a subscribed topic.
    Publish(Publish),
    /// The connection failed or was lost; the next [`Session::next`] retries after the
    /// back-off.
    Lost {
        /// What went wrong, for a log line (refused logins named).
        error: String,
        /// The session was connected until now (a loss, not a failed attempt).
        was_connected: bool,
        /// The first failure of a streak (log it loudly; the retries quietly).
        first: bool,
    },
    /// Anything else (acknowledgements, pings, outgoing packets).
    Other,
}

/// A client, its event loop and its back-off.
pub struct Session {
    client: AsyncClient,
    events: EventLoop,
    backoff: Backoff,
    retry_at: Option<tokio::time::Instant>,
    connected: bool,
}

impl Session {
    /// A session with `options` and a request queue of `capacity`; nothing connects until
    /// [`Session::next`] is polled.
    pub fn new(options: MqttOptions, capacity: usize) -> Self {
        let (client, events) = AsyncClient::new(options, capacity);
        Self {
            client,
            events,
            backoff: Backoff::default(),
            retry_at: None,
            connected: false,
        }
    }

    /// The client, to subscribe and publish.
    pub fn client(&self) -> &AsyncClient {
        &self.client
    }

    /// The client and the event loop, for a last flush.
    pub fn parts(&mut self) -> (&AsyncClient, &mut EventLoop) {
        (&self.client, &mut self.events)
    }

    /// Whether the broker has accepted the connection and not lost it since.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// The next event. Cancel-safe: dropped while it waits out the back-off or for the
    /// broker, it resumes the same wait when called again.
    pub async fn next(&mut self) -> SessionEvent {
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
        }
        match self.events.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                self.backoff.reset();
                self.connected = true;
                SessionEvent::Connected
            }
            Ok(Event::Incoming(Packet::Publish(p))) => SessionEvent::Publish(p),
            Ok(_) => SessionEvent::Other,
            Err(e) => {
                let first = self.backoff.is_fresh();
                let was_connected = std::mem::replace(&mut self.connected, false);
                self.retry_at = Some(tokio::time::Instant::now() + self.backoff.next_delay());
                SessionEvent::Lost {
                    error: describe_error(&e),
                    was_connected,
                    first,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A loopback port nothing listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn the_back_off_is_waited_inside_next_so_a_stop_is_taken_meanwhile() {
        let options = MqttOptions::new("session-test", "127.0.0.1", closed_port());
        let mut session = Session::new(options, 8);
        let lost = tokio::time::timeout(Duration::from_secs(10), session.next())
            .await
            .expect("a refused connection is reported");
        assert!(
            matches!(
                lost,
                SessionEvent::Lost {
                    was_connected: false,
                    first: true,
                    ..
                }
            ),
            "{lost:?}"
        );
        // The back-off (at least 50 ms now) runs inside `next()`: a ready branch beside it wins,
        // as a stop signal or a training result does in the drivers' `select!`.
        let stopped = tokio::select! {
            _ = session.next() => false,
            _ = std::future::ready(()) => true,
        };
        assert!(stopped);
        // Dropping that future kept the back-off: the next call does not retry at once.
        let retried = tokio::time::timeout(Duration::from_millis(10), session.next()).await;
        assert!(retried.is_err(), "retried before the back-off");
        assert!(!session.is_connected());
    }
}
