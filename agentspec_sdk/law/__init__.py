"""The Draft Law: closed forms, estimators and falsifier verdicts. numpy only."""
