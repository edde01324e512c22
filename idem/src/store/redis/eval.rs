//! A script call as one `EVALSHA` command, built in place: redis-rs's
//! `ScriptInvocation` gathers each key and argument into a buffer of its own, then
//! copies them all into the command it sends, on every claim and every completion.
//! As there, a server that does not know the script (restarted, failed over,
//! `SCRIPT FLUSH`) is sent it, and the call is made again.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// One call of `script` on one key.
pub(crate) struct Eval<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Eval<'a> {
    /// `script` on `key`, arguments to follow.
    pub(crate) fn new(script: &'a Script, key: &str) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(key);
        Eval { script, cmd }
    }

    /// Adds an argument (`ARGV[n]`).
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Makes the call on `con`, loading the script first if the server asks for it.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        con: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(con).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(con).await?;
                self.cmd.query_async(con).await
            }
            result => result,
        }
    }
}
