-- A source read through a column mapping (a table that is not justonce's): the mapping's
-- settings as the person gave them (a preset's name or a JSON object), parsed again by
-- each scan. NULL: the table is justonce's `justonce_keys` shape.
ALTER TABLE source ADD COLUMN mapping TEXT;
