-- A sign-in attempt is admitted and counted in one ledger step, and an account's lock
-- grows with its failures: `locked_until` (epoch seconds; 0 = not locked) is when the
-- account's next attempt may be checked. Rows of scope 'account' count consecutive
-- failures since the last success; rows of scope 'address' count the attempts of a
-- client address in a fixed window.
ALTER TABLE auth_throttle ADD COLUMN locked_until REAL NOT NULL DEFAULT 0;
