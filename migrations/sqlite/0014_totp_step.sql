-- TOTP replay (issue 3): the last time step whose code signed the person in. A code is
-- accepted only for a later step, by one conditional UPDATE, so the same code (or an older
-- one) is refused on every replica.
ALTER TABLE app_user ADD COLUMN totp_last_step INTEGER;
