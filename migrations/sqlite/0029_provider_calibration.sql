-- A provider's last calibration against its tenant's known outcomes (the share of effects
-- the application recorded as succeeded that its lookup finds, the clock offsets, why it
-- is or is not calibrated), as the reconciler measured it for the provider's current
-- settings: shown in `reckon provider list` and on the settings page. A change of settings
-- clears it. JSON, NULL until measured.
ALTER TABLE provider ADD COLUMN calibration TEXT;
