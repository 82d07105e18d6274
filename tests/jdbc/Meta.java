import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.ResultSet;

/** Prints what JDBC's DatabaseMetaData says of resgroups serve: java Meta.java PORT. */
public class Meta {
  public static void main(String[] args) throws Exception {
    String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/resgroups";
    try (Connection c = DriverManager.getConnection(url, "admin", "")) {
      DatabaseMetaData m = c.getMetaData();
      System.out.println("driver " + m.getDriverVersion());
      try (ResultSet r = m.getTables(null, null, "%", new String[] {"TABLE", "VIEW"})) {
        while (r.next()) {
          System.out.println("table " + r.getString("TABLE_SCHEM") + "." + r.getString("TABLE_NAME")
              + " " + r.getString("TABLE_TYPE"));
        }
      }
      try (ResultSet r = m.getColumns(null, "public", "readings", "%")) {
        while (r.next()) {
          System.out.println("column " + r.getString("COLUMN_NAME") + " " + r.getString("TYPE_NAME")
              + " " + r.getInt("DATA_TYPE"));
        }
      }
      try (ResultSet r = m.getSchemas()) {
        while (r.next()) {
          System.out.println("schema " + r.getString(1));
        }
      }
    }
  }
}
