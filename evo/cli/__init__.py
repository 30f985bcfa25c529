"""The kfactory command line: run, resume, report, sql, lessons, bench."""
