"""What can go wrong in the storage core; each message names the file, record or
setting, and what to do."""


class StoreError(Exception):
    """The store cannot go on (disk full, permissions, another writer...)."""


class SettingError(ValueError):
    """A setting has a value the storage cannot use; the message names the setting."""


class CatalogError(Exception):
    """The catalog cannot be used as it is."""


class ArchiveError(Exception):
    """A record cannot be read back."""


class TruncatedRecordError(ArchiveError):
    """The file ends inside a record."""
