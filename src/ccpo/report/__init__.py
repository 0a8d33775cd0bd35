"""Result files, tables and reports."""
