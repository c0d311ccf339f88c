from tests.clause_runner import load_catalog

load_catalog()
