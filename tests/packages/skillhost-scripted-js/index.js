exports.ok = true;
