"""The members' portal: the pages people who use the fleet see, on the public listener under ``/portal``."""
