-- A record's key as its 32 bytes instead of 64 hex characters: about 65 bytes less
-- per record (in the row and in the primary key's index). Applied with the table
-- itself, when it is empty; see WITH_NEW_TABLE in postgres.rs for older tables.
ALTER TABLE idem_records ALTER COLUMN id TYPE bytea USING decode(id, 'hex');
