-- Sign-in locks that cannot deny the right person on a trusted path.
--
-- `auth_throttle` rows of scope 'pair' count one sender's consecutive failures for one
-- account (key: account, newline, sender), so an attacker's failures lock only the
-- attacker's own pair. Scope 'device' does the same for a browser that signed in to the
-- account before (key: account, newline, the device id's hash). Scope 'account' counts an
-- account's failures from every sender that is not at home, with a much higher limit, and
-- scope 'home' marks a sender (address) the account has signed in from. `account` names
-- the account of the rows an unlock or a new password clears.
ALTER TABLE auth_throttle ADD COLUMN account TEXT;
UPDATE auth_throttle SET account = key WHERE scope = 'account';
CREATE INDEX auth_throttle_account ON auth_throttle (account);

-- A browser that signed in to `account`: it holds the id in its `__Host-reckon_device`
-- cookie, the ledger only its SHA-256, so a copy of the database is no cookie.
CREATE TABLE known_device (
    id_hash     TEXT NOT NULL,
    account     TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (id_hash, account)
);
